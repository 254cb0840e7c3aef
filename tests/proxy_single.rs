//! One redis-server behind the proxy, compared command by command with a second, independent
//! redis-server ("differential test"): the proxy must be indistinguishable from the node,
//! on the wire and in what the node ends up holding.

mod support;

use std::time::{Duration, Instant};
use support::*;

/// The node behind the proxy, an independent reference server, and the proxy.
struct Single {
    node: Redis,
    reference: Redis,
    proxy: Proxy,
}

fn single() -> Option<Single> {
    if !have_redis() {
        return None;
    }
    let node = Redis::start();
    let reference = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    Some(Single {
        node,
        reference,
        proxy,
    })
}

/// A proxy client and a reference client driven in lockstep.
struct Diff {
    p: Client,
    r: Client,
    count: usize,
}

impl Diff {
    fn new(s: &Single) -> Diff {
        Diff {
            p: s.proxy.client(),
            r: s.reference.client(),
            count: 0,
        }
    }

    fn both(&mut self, args: &[&str]) -> (Reply, Reply) {
        self.count += 1;
        (self.p.cmd(args), self.r.cmd(args))
    }

    /// Same reply from the proxy as from Redis itself.
    fn same(&mut self, args: &[&str]) -> Reply {
        let (p, r) = self.both(args);
        assert_eq!(p, r, "{args:?}: proxy replied {p}, redis replied {r}");
        p
    }

    /// Same reply up to the order of elements (order follows each server's hash seed).
    fn same_unordered(&mut self, args: &[&str]) -> Reply {
        let (p, r) = self.both(args);
        assert_eq!(
            p.sorted(),
            r.sorted(),
            "{args:?}: proxy replied {p}, redis replied {r}"
        );
        p
    }

    fn same_owned(&mut self, args: Vec<String>) -> Reply {
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        self.same(&a)
    }
}

/// Everything a node holds in one database, in an order-independent textual form.
fn dataset(node: &Redis, db: u32) -> Vec<String> {
    let mut c = node.client();
    assert_eq!(c.cmd(&["SELECT", &db.to_string()]), Reply::ok());
    let mut keys = c.cmd(&["KEYS", "*"]).strings();
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let t = c.cmd(&["TYPE", &k]).as_str();
        let v = match t.as_str() {
            "string" => c.cmd(&["GET", &k]).to_string(),
            "list" => c.cmd(&["LRANGE", &k, "0", "-1"]).to_string(),
            "hash" => {
                let mut fields: Vec<String> = c
                    .cmd(&["HGETALL", &k])
                    .pairs()
                    .iter()
                    .map(|(f, v)| format!("{f}={v}"))
                    .collect();
                fields.sort();
                fields.join(",")
            }
            "set" => c.cmd(&["SMEMBERS", &k]).sorted().to_string(),
            "zset" => c.cmd(&["ZRANGE", &k, "0", "-1", "WITHSCORES"]).to_string(),
            "stream" => c.cmd(&["XRANGE", &k, "-", "+"]).to_string(),
            _ => c.cmd(&["DUMP", &k]).to_string(),
        };
        let has_ttl = c.cmd(&["PTTL", &k]).as_int() >= 0;
        out.push(format!("{k} {t} ttl={has_ttl} {v}"));
    }
    out
}

fn assert_same_data(s: &Single, db: u32) {
    let got = dataset(&s.node, db);
    let want = dataset(&s.reference, db);
    assert!(
        !want.is_empty(),
        "the reference holds nothing in db {db}: test is vacuous"
    );
    assert_eq!(
        got, want,
        "node behind the proxy (db {db}) differs from the reference"
    );
}

#[test]
fn strings_hashes_lists_sets_and_zsets_match_redis() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    for i in 0..40 {
        let (k, v) = (format!("s:{i}"), format!("value-{i}"));
        d.same(&["SET", &k, &v]);
        d.same(&["GET", &k]);
        d.same(&["APPEND", &k, "-tail"]);
        d.same(&["STRLEN", &k]);
        d.same(&["INCRBY", &format!("c:{i}"), &i.to_string()]);
        d.same(&["HSET", "h:big", &format!("f{i}"), &v]);
        d.same(&["RPUSH", "l:big", &v]);
        d.same(&["SADD", "set:big", &v]);
        d.same(&["ZADD", "z:big", &(i * 7 % 13).to_string(), &v]);
    }
    for args in [
        &["GETRANGE", "s:1", "0", "3"][..],
        &["SETRANGE", "s:1", "2", "XYZ"],
        &["GET", "s:1"],
        &["INCR", "n"],
        &["DECR", "n"],
        &["DECRBY", "n", "10"],
        &["INCRBYFLOAT", "f", "10.5"],
        &["INCRBYFLOAT", "f", "-0.25"],
        &["INCR", "s:2"],
        &["MSET", "m1", "a", "m2", "b", "m3", "c"],
        &["MGET", "m1", "m2", "nope", "m3"],
        &["MSETNX", "m1", "x", "m4", "y"],
        &["SETNX", "m5", "z"],
        &["SETNX", "m5", "zz"],
        &["GETSET", "m5", "w"],
        &["GETDEL", "m1"],
        &["GET", "m1"],
        &["SET", "m2", "new", "XX", "GET"],
        &["SET", "m6", "v", "NX"],
        &["SET", "m6", "v", "NX"],
        &["LCS", "s:10", "s:11"],
        &["SUBSTR", "s:3", "1", "4"],
        &["SET"],
        &["GET", "a", "b"],
        &["HSET", "h", "f1", "v1", "f2", "v2", "f3", "3"],
        &["HGET", "h", "f1"],
        &["HMGET", "h", "f1", "nope", "f2"],
        &["HINCRBY", "h", "f3", "4"],
        &["HINCRBYFLOAT", "h", "f3", "0.5"],
        &["HEXISTS", "h", "f2"],
        &["HDEL", "h", "f2", "nope"],
        &["HLEN", "h"],
        &["HKEYS", "h"],
        &["HVALS", "h"],
        &["HGETALL", "h"],
        &["HSETNX", "h", "f1", "x"],
        &["HSTRLEN", "h", "f1"],
        &["HSCAN", "h", "0"],
        &["HGET", "s:1", "f"],
        &["RPUSH", "l", "a", "b", "c", "d", "e"],
        &["LPUSH", "l", "z"],
        &["LRANGE", "l", "0", "-1"],
        &["LLEN", "l"],
        &["LINDEX", "l", "2"],
        &["LSET", "l", "0", "zz"],
        &["LINSERT", "l", "BEFORE", "c", "bb"],
        &["LREM", "l", "1", "d"],
        &["LPOS", "l", "c"],
        &["LPOP", "l", "2"],
        &["RPOP", "l"],
        &["RPOPLPUSH", "l", "l2"],
        &["LMOVE", "l", "l2", "LEFT", "RIGHT"],
        &["LTRIM", "l", "0", "0"],
        &["LRANGE", "l2", "0", "-1"],
        &["SADD", "s", "a", "b", "c", "1", "2"],
        &["SADD", "t", "b", "c", "d"],
        &["SISMEMBER", "s", "a"],
        &["SMISMEMBER", "s", "a", "x", "c"],
        &["SCARD", "s"],
        &["SREM", "s", "1", "nope"],
        &["SINTERSTORE", "st", "s", "t"],
        &["SINTERCARD", "2", "s", "t"],
        &["SMOVE", "s", "t", "a"],
        &[
            "ZADD", "z", "1", "one", "2", "two", "3", "three", "2.5", "twohalf",
        ],
        &["ZSCORE", "z", "two"],
        &["ZINCRBY", "z", "10", "one"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["ZRANGE", "z", "(1", "+inf", "BYSCORE", "LIMIT", "1", "2"],
        &["ZREVRANGE", "z", "0", "1"],
        &["ZRANK", "z", "three"],
        &["ZREVRANK", "z", "three"],
        &["ZCOUNT", "z", "2", "3"],
        &["ZMSCORE", "z", "one", "nope"],
        &["ZADD", "lex", "0", "a", "0", "b", "0", "c", "0", "d"],
        &["ZRANGEBYLEX", "lex", "[b", "(d"],
        &["ZREM", "z", "two"],
        &["ZCARD", "z"],
        &["ZPOPMIN", "z"],
        &["ZUNIONSTORE", "zu", "2", "z", "lex", "WEIGHTS", "2", "1"],
        &["ZADD", "z", "notanumber", "x"],
        &["EXISTS", "s:1", "nope", "s:1"],
        &["TYPE", "z"],
        &["TYPE", "nope"],
        &["RENAME", "m2", "m2b"],
        &["RENAMENX", "m2b", "m3"],
        &["COPY", "h", "hcopy"],
        &["OBJECT", "ENCODING", "l:big"],
        &["TOUCH", "s:1", "s:2", "nope"],
        &["DEL", "s:39", "nope"],
        &["UNLINK", "s:38"],
        &["SORT", "lex", "ALPHA", "DESC"],
        &["DBSIZE"],
        &["ECHO", "hello"],
        &["PING"],
        &["PING", "msg"],
    ] {
        d.same(args);
    }
    // Order of big (hash-table encoded) collections follows each server's random seed.
    for args in [
        &["HGETALL", "h:big"][..],
        &["SMEMBERS", "set:big"],
        &["SUNION", "s", "t", "set:big"],
        &["SDIFF", "s", "t"],
        &["SINTER", "s", "t"],
        &["KEYS", "*"],
    ] {
        d.same_unordered(args);
    }
    d.same(&["LRANGE", "l:big", "0", "-1"]);
    d.same(&["ZRANGE", "z:big", "0", "-1", "WITHSCORES"]);
    assert!(d.count >= 450, "only {} commands compared", d.count);
    assert_same_data(&s, 0);
}

#[test]
fn streams_hyperloglog_bitmaps_and_geo_match_redis() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    for i in 1..=30 {
        d.same_owned(vec![
            "XADD".into(),
            "stream".into(),
            format!("{i}-1"),
            "n".into(),
            i.to_string(),
            "who".into(),
            format!("user{}", i % 4),
        ]);
        d.same_owned(vec![
            "PFADD".into(),
            "hll".into(),
            format!("e{i}"),
            format!("e{}", i * 3),
        ]);
        d.same_owned(vec![
            "SETBIT".into(),
            "bits".into(),
            (i * 5).to_string(),
            "1".into(),
        ]);
    }
    for args in [
        &["XLEN", "stream"][..],
        &["XRANGE", "stream", "-", "+", "COUNT", "5"],
        &["XRANGE", "stream", "10", "12-1"],
        &["XREVRANGE", "stream", "+", "-", "COUNT", "3"],
        &["XREAD", "COUNT", "2", "STREAMS", "stream", "28-0"],
        &["XGROUP", "CREATE", "stream", "g1", "0"],
        &["XGROUP", "CREATE", "stream", "g1", "0"],
        &[
            "XREADGROUP",
            "GROUP",
            "g1",
            "alice",
            "COUNT",
            "3",
            "STREAMS",
            "stream",
            ">",
        ],
        &[
            "XREADGROUP",
            "GROUP",
            "g1",
            "bob",
            "COUNT",
            "2",
            "STREAMS",
            "stream",
            ">",
        ],
        &["XACK", "stream", "g1", "1-1", "2-1", "99-1"],
        &["XPENDING", "stream", "g1"],
        &[
            "XREADGROUP",
            "GROUP",
            "g1",
            "alice",
            "STREAMS",
            "stream",
            "0",
        ],
        &["XDEL", "stream", "30-1"],
        &["XTRIM", "stream", "MAXLEN", "20"],
        &["XADD", "stream", "5-1", "x", "y"],
        &["XLEN", "stream"],
        &["PFCOUNT", "hll"],
        &["PFADD", "hll2", "a", "b", "e1"],
        &["PFMERGE", "hllm", "hll", "hll2"],
        &["PFCOUNT", "hllm"],
        &["PFCOUNT", "hll", "hll2"],
        &["GETBIT", "bits", "10"],
        &["GETBIT", "bits", "11"],
        &["BITCOUNT", "bits"],
        &["BITCOUNT", "bits", "0", "9", "BIT"],
        &["BITPOS", "bits", "1"],
        &["SETBIT", "bits2", "10", "1"],
        &["BITOP", "AND", "band", "bits", "bits2"],
        &["BITOP", "OR", "bor", "bits", "bits2"],
        &["BITOP", "NOT", "bnot", "bits"],
        &["GET", "bor"],
        &[
            "BITFIELD", "bf", "SET", "u8", "0", "255", "GET", "u8", "0", "INCRBY", "u4", "8", "3",
        ],
        &[
            "BITFIELD", "bf", "OVERFLOW", "SAT", "INCRBY", "u4", "8", "100", "GET", "i5", "3",
        ],
        &["BITFIELD_RO", "bf", "GET", "u16", "0"],
        &[
            "GEOADD",
            "geo",
            "13.361389",
            "38.115556",
            "Palermo",
            "15.087269",
            "37.502669",
            "Catania",
        ],
        &["GEOADD", "geo", "12.496366", "41.902782", "Rome"],
        &["GEODIST", "geo", "Palermo", "Catania", "km"],
        &["GEOPOS", "geo", "Palermo", "Nowhere"],
        &["GEOHASH", "geo", "Palermo", "Rome"],
        &[
            "GEOSEARCH",
            "geo",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "200",
            "km",
            "ASC",
            "WITHDIST",
        ],
        &[
            "GEOSEARCH",
            "geo",
            "FROMMEMBER",
            "Rome",
            "BYBOX",
            "1000",
            "1000",
            "km",
            "DESC",
            "COUNT",
            "2",
        ],
        &[
            "GEORADIUS",
            "geo",
            "15",
            "37",
            "300",
            "km",
            "WITHCOORD",
            "ASC",
        ],
        &[
            "GEOSEARCHSTORE",
            "geo2",
            "geo",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "200",
            "km",
        ],
        &["ZCARD", "geo2"],
    ] {
        d.same(args);
    }
    assert!(d.count >= 130, "only {} commands compared", d.count);
    assert_same_data(&s, 0);
}

#[test]
fn expiry_and_ttl_behave_like_redis() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    let near = |a: &Reply, b: &Reply, slack: i64| (a.as_int() - b.as_int()).abs() <= slack;
    d.same(&["SET", "e1", "v", "EX", "100"]);
    let (p, r) = d.both(&["TTL", "e1"]);
    assert!(
        near(&p, &r, 1) && p.as_int() > 95,
        "TTL via proxy {p}, redis {r}"
    );
    let (p, r) = d.both(&["PTTL", "e1"]);
    assert!(near(&p, &r, 1500), "PTTL via proxy {p}, redis {r}");
    d.same(&["EXPIRE", "e1", "50"]);
    let (p, _) = d.both(&["TTL", "e1"]);
    assert!((48..=50).contains(&p.as_int()), "TTL after EXPIRE 50: {p}");
    d.same(&["PERSIST", "e1"]);
    d.same(&["TTL", "e1"]);
    d.same(&["TTL", "missing"]);
    d.same(&["EXPIREAT", "e1", "4102444800"]);
    d.same(&["EXPIRETIME", "e1"]);
    d.same(&["PEXPIREAT", "e1", "4102444800123"]);
    d.same(&["PEXPIRETIME", "e1"]);
    d.same(&["EXPIRE", "e1", "100", "NX"]);
    d.same(&["EXPIRE", "e1", "100", "GT"]);
    d.same(&["SETEX", "e2", "100", "v"]);
    d.same(&["PSETEX", "e3", "100000", "v"]);
    d.same(&["GETEX", "e3", "PERSIST"]);
    d.same(&["TTL", "e3"]);
    d.same(&["SETEX", "e4", "0", "v"]);
    d.same(&["SET", "short", "v", "PX", "150"]);
    d.same(&["GET", "short"]);
    std::thread::sleep(Duration::from_millis(400));
    d.same(&["GET", "short"]);
    d.same(&["EXISTS", "short"]);
    // The TTL is on the node itself, not emulated.
    let mut n = s.node.client();
    let ttl = n.cmd(&["TTL", "e2"]).as_int();
    assert!((95..=100).contains(&ttl), "TTL of e2 on the node: {ttl}");
    assert_same_data(&s, 0);
}

#[test]
fn scan_and_keys_cover_every_key() {
    let Some(s) = single() else { return };
    let mut p = s.proxy.client();
    let want: Vec<String> = (0..300).map(|i| format!("scan:{i:03}")).collect();
    let sets: Vec<Vec<String>> = want
        .iter()
        .map(|k| vec!["SET".into(), k.clone(), "x".into()])
        .collect();
    assert!(p.pipeline(&sets).iter().all(|r| *r == Reply::ok()));
    p.cmd(&["SET", "other", "x"]);
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    let mut rounds = 0;
    loop {
        let r = p.cmd(&["SCAN", &cursor, "MATCH", "scan:*", "COUNT", "40"]);
        let parts = r.as_array();
        cursor = parts[0].as_str();
        seen.extend(parts[1].strings());
        rounds += 1;
        assert!(rounds < 1000, "SCAN does not terminate");
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        want,
        "SCAN MATCH scan:* through the proxy"
    );
    let mut keys = p.cmd(&["KEYS", "scan:*"]).strings();
    keys.sort();
    assert_eq!(keys, want);
    assert_eq!(p.cmd(&["DBSIZE"]), Reply::Int(301));
    assert_eq!(s.node.dbsize(), 301);
    // Collection scans, big enough to be hash tables and need several rounds.
    let mut d = Diff::new(&s);
    for i in 0..200 {
        d.same(&["SADD", "bigset", &format!("m{i}")]);
    }
    let mut members = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let r = d.p.cmd(&["SSCAN", "bigset", &cursor, "COUNT", "20"]);
        cursor = r.as_array()[0].as_str();
        members.extend(r.as_array()[1].strings());
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(members.len(), 200);
}

#[test]
fn select_1_puts_keys_in_db_1_of_the_node() {
    let Some(s) = single() else { return };
    let mut a = s.proxy.client();
    let mut b = s.proxy.client();
    assert_eq!(a.cmd(&["SELECT", "1"]), Reply::ok());
    assert_eq!(a.cmd(&["SET", "k", "in-db1"]), Reply::ok());
    assert_eq!(
        b.cmd(&["GET", "k"]),
        Reply::Bulk(None),
        "a client that did not SELECT sees db 0"
    );
    assert_eq!(b.cmd(&["SET", "k", "in-db0"]), Reply::ok());
    assert_eq!(a.cmd(&["GET", "k"]), Reply::bulk("in-db1"));
    // Two clients on different databases interleaving through shared backend connections.
    let ta = std::thread::spawn(move || {
        let cmds: Vec<Vec<String>> = (0..300)
            .map(|i| vec!["SET".into(), format!("x{i}"), "one".into()])
            .collect();
        for _ in 0..5 {
            assert!(a.pipeline(&cmds).iter().all(|r| *r == Reply::ok()));
        }
        a
    });
    let cmds: Vec<Vec<String>> = (0..300)
        .map(|i| vec!["SET".into(), format!("x{i}"), "zero".into()])
        .collect();
    for _ in 0..5 {
        assert!(b.pipeline(&cmds).iter().all(|r| *r == Reply::ok()));
    }
    let mut a = ta.join().expect("client a");
    let mut n = s.node.client();
    assert_eq!(n.cmd(&["GET", "k"]), Reply::bulk("in-db0"));
    assert_eq!(n.cmd(&["DBSIZE"]), Reply::Int(301), "db 0 on the node");
    assert_eq!(n.cmd(&["GET", "x7"]), Reply::bulk("zero"));
    assert_eq!(n.cmd(&["SELECT", "1"]), Reply::ok());
    assert_eq!(n.cmd(&["GET", "k"]), Reply::bulk("in-db1"));
    assert_eq!(n.cmd(&["DBSIZE"]), Reply::Int(301), "db 1 on the node");
    assert_eq!(n.cmd(&["GET", "x7"]), Reply::bulk("one"));
    assert_eq!(a.cmd(&["SELECT", "0"]), Reply::ok());
    assert_eq!(a.cmd(&["GET", "k"]), Reply::bulk("in-db0"));
    let (p, r) = (
        a.cmd(&["SELECT", "99"]),
        s.reference.client().cmd(&["SELECT", "99"]),
    );
    assert_eq!(p, r, "SELECT of a database that does not exist");
}

#[test]
fn multi_exec_and_watch_match_redis() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    for args in [
        &["MULTI"][..],
        &["SET", "t", "1"],
        &["INCR", "t"],
        &["GET", "t"],
        &["EXEC"],
        &["SET", "str", "abc"],
        &["MULTI"],
        &["INCR", "str"],
        &["SET", "t2", "x"],
        &["EXEC"],
        &["MULTI"],
        &["SET", "only-one-arg"],
        &["SET", "t3", "x"],
        &["EXEC"],
        &["GET", "t3"],
        &["MULTI"],
        &["SET", "t4", "x"],
        &["DISCARD"],
        &["GET", "t4"],
        &["EXEC"],
        &["DISCARD"],
        &["WATCH", "w"],
        &["MULTI"],
        &["SET", "w", "mine"],
        &["EXEC"],
    ] {
        d.same(args);
    }
    // WATCH aborts the transaction when another connection changes the key.
    for addr in [s.proxy.addr(), s.reference.addr()] {
        let mut a = Client::connect(&addr);
        let mut b = Client::connect(&addr);
        assert_eq!(a.cmd(&["WATCH", "w2"]), Reply::ok());
        assert_eq!(b.cmd(&["SET", "w2", "theirs"]), Reply::ok());
        assert_eq!(a.cmd(&["MULTI"]), Reply::ok());
        assert_eq!(
            a.cmd(&["SET", "w2", "mine"]),
            Reply::Simple("QUEUED".into())
        );
        // Another client's commands are not swallowed by a's open transaction.
        assert_eq!(b.cmd(&["SET", "side", "1"]), Reply::ok(), "on {addr}");
        assert_eq!(
            a.cmd(&["EXEC"]),
            Reply::Array(None),
            "EXEC after a WATCHed key changed, on {addr}"
        );
        assert_eq!(b.cmd(&["GET", "w2"]), Reply::bulk("theirs"));
    }
    assert_same_data(&s, 0);
}

#[test]
fn eval_and_functions_match_redis() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    let lib = "#!lua name=testlib\n\
               redis.register_function('getk', function(keys, args) return redis.call('GET', keys[1]) end)\n\
               redis.register_function{function_name='ro', callback=function(keys, args) return #args end, flags={'no-writes'}}";
    let script = "return {redis.call('INCRBY', KEYS[1], ARGV[1]), ARGV[2]}";
    let sha = d.same(&["SCRIPT", "LOAD", script]).as_str();
    for args in [
        &["EVAL", script, "1", "ev", "5", "tag"][..],
        &["EVALSHA", &sha, "1", "ev", "2", "again"],
        &["EVAL", "return redis.call('GET', KEYS[1])", "1", "ev"],
        &["EVAL", "return redis.error_reply('custom failure')", "0"],
        &["EVAL", "return 3.99", "0"],
        &["EVALSHA", "0000000000000000000000000000000000000000", "0"],
        &["SCRIPT", "EXISTS", &sha, "ffff"],
        &["FUNCTION", "LOAD", lib],
        &["SET", "fk", "fv"],
        &["FCALL", "getk", "1", "fk"],
        &["FCALL_RO", "ro", "0", "a", "b"],
        &["FCALL", "nosuch", "0"],
        &["FUNCTION", "DELETE", "testlib"],
        &["FCALL", "getk", "1", "fk"],
    ] {
        d.same(args);
    }
    assert_same_data(&s, 0);
}

#[test]
fn pubsub_passes_through() {
    let Some(s) = single() else { return };
    let mut sub = s.proxy.client();
    let mut psub = s.proxy.client();
    let mut publisher = s.proxy.client();
    let arr = |v: &[&str]| Reply::Array(Some(v.iter().map(|x| Reply::bulk(x)).collect()));
    let subscribed = sub.cmd(&["SUBSCRIBE", "news"]);
    assert_eq!(
        subscribed,
        Reply::Array(Some(vec![
            Reply::bulk("subscribe"),
            Reply::bulk("news"),
            Reply::Int(1)
        ]))
    );
    let p = psub.cmd(&["PSUBSCRIBE", "ne*"]);
    assert_eq!(p.as_array()[0], Reply::bulk("psubscribe"));
    assert_eq!(publisher.cmd(&["PUBLISH", "news", "hello"]), Reply::Int(2));
    assert_eq!(sub.read_reply(), arr(&["message", "news", "hello"]));
    assert_eq!(
        psub.read_reply(),
        arr(&["pmessage", "ne*", "news", "hello"])
    );
    // A publisher talking to Redis directly reaches a subscriber behind the proxy.
    assert_eq!(
        s.node.client().cmd(&["PUBLISH", "news", "direct"]),
        Reply::Int(2)
    );
    assert_eq!(sub.read_reply(), arr(&["message", "news", "direct"]));
    assert_eq!(
        psub.read_reply(),
        arr(&["pmessage", "ne*", "news", "direct"])
    );
    assert_eq!(
        sub.cmd(&["PING"]),
        arr(&["pong", ""]),
        "PING while subscribed"
    );
    assert_eq!(
        sub.cmd(&["UNSUBSCRIBE", "news"]),
        Reply::Array(Some(vec![
            Reply::bulk("unsubscribe"),
            Reply::bulk("news"),
            Reply::Int(0)
        ]))
    );
    assert_eq!(
        sub.cmd(&["PING"]),
        Reply::Simple("PONG".into()),
        "PING after leaving pub/sub"
    );
    assert_eq!(sub.cmd(&["SET", "after", "sub"]), Reply::ok());
    assert_eq!(s.node.client().cmd(&["GET", "after"]), Reply::bulk("sub"));
    assert_eq!(publisher.cmd(&["PUBLISH", "news", "x"]), Reply::Int(1));
}

#[test]
fn blpop_is_served_by_a_later_lpush_from_another_client() {
    let Some(s) = single() else { return };
    let mut waiter = s.proxy.client();
    let mut other = s.proxy.client();
    waiter.send_raw(&encode(&["BLPOP", "queue", "5"]));
    std::thread::sleep(Duration::from_millis(300));
    // The blocked client must not hold up anyone else.
    let t = Instant::now();
    assert_eq!(other.cmd(&["SET", "unrelated", "1"]), Reply::ok());
    assert_eq!(other.cmd(&["LPUSH", "queue", "job1"]), Reply::Int(1));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "other clients waited {:?} behind a BLPOP",
        t.elapsed()
    );
    let got = waiter.read_reply();
    assert_eq!(
        got,
        Reply::Array(Some(vec![Reply::bulk("queue"), Reply::bulk("job1")]))
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "BLPOP served after {:?}",
        t.elapsed()
    );
    assert_eq!(s.node.client().cmd(&["LLEN", "queue"]), Reply::Int(0));
    // A timeout gives the same nil as Redis, and the connection still works.
    let t = Instant::now();
    let (p, r) = (
        waiter.cmd(&["BLPOP", "empty", "0.3"]),
        s.reference.client().cmd(&["BLPOP", "empty", "0.3"]),
    );
    assert_eq!(p, r);
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert_eq!(waiter.cmd(&["PING"]), Reply::Simple("PONG".into()));
}

#[test]
fn hello_3_switches_this_client_to_resp3() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    d.same(&["HSET", "h", "a", "1", "b", "2"]);
    d.same(&["SADD", "s", "x", "y"]);
    d.same(&["ZADD", "z", "1.5", "m"]);
    let hello = d.p.cmd(&["HELLO", "3"]);
    let fields = hello.pairs();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert!(
        matches!(hello, Reply::Map(_)),
        "HELLO 3 must return a RESP3 map, got {hello}"
    );
    assert_eq!(get("proto"), Some(Reply::Int(3)), "HELLO 3 reply {hello}");
    assert!(
        get("server").is_some() && get("version").is_some(),
        "HELLO 3 reply {hello}"
    );
    d.r.cmd(&["HELLO", "3"]);
    let h = d.same_unordered(&["HGETALL", "h"]);
    assert!(matches!(h, Reply::Map(_)), "HGETALL after HELLO 3: {h}");
    for args in [
        &["GET", "missing"][..],
        &["ZSCORE", "z", "m"],
        &["EXISTS", "h"],
        &["HMGET", "h", "a", "nope"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["CONFIG", "GET", "maxmemory"],
    ] {
        d.same(args);
    }
    let set = d.same_unordered(&["SMEMBERS", "s"]);
    assert!(matches!(set, Reply::Set(_)), "SMEMBERS in RESP3: {set}");
    // Another client of the same proxy still speaks RESP2.
    let mut plain = s.proxy.client();
    assert!(matches!(
        plain.cmd(&["HGETALL", "h"]),
        Reply::Array(Some(_))
    ));
    assert_eq!(plain.cmd(&["GET", "missing"]), Reply::Bulk(None));
    d.p.cmd(&["HELLO", "2"]);
    d.r.cmd(&["HELLO", "2"]);
    d.same_unordered(&["HGETALL", "h"]);
}

#[test]
fn client_setname_and_getname_are_per_client() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    d.same(&["CLIENT", "GETNAME"]);
    d.same(&["CLIENT", "SETNAME", "checkout-api"]);
    d.same(&["CLIENT", "GETNAME"]);
    d.same(&["CLIENT", "SETNAME", "has space"]);
    let mut other = s.proxy.client();
    assert_eq!(other.cmd(&["CLIENT", "SETNAME", "billing"]), Reply::ok());
    assert_eq!(other.cmd(&["CLIENT", "GETNAME"]), Reply::bulk("billing"));
    assert_eq!(d.p.cmd(&["CLIENT", "GETNAME"]), Reply::bulk("checkout-api"));
}

#[test]
fn info_has_a_proxy_section_and_the_backend_version() {
    let Some(s) = single() else { return };
    let info = s.proxy.client().cmd(&["INFO"]).as_str();
    let node_info = s.node.client().cmd(&["INFO", "server"]).as_str();
    let version = node_info
        .lines()
        .find(|l| l.starts_with("redis_version:"))
        .expect("node version");
    assert!(
        info.lines().any(|l| l == version),
        "INFO through the proxy lacks {version:?}:\n{info}"
    );
    let has_section = info.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("# ") && (l.contains("saltshaker") || l.contains("proxy"))
    });
    assert!(
        has_section,
        "INFO through the proxy has no proxy section:\n{info}"
    );
}

#[test]
fn a_pipeline_of_1000_commands_gets_replies_in_order() {
    let Some(s) = single() else { return };
    let mut p = s.proxy.client();
    let mut cmds = Vec::new();
    for i in 0..334 {
        cmds.push(vec!["SET".to_string(), format!("p:{i}"), format!("v{i}")]);
        cmds.push(vec!["INCR".to_string(), "counter".to_string()]);
        cmds.push(vec!["GET".to_string(), format!("p:{i}")]);
    }
    cmds.truncate(1000);
    let replies = p.pipeline(&cmds);
    assert_eq!(replies.len(), 1000);
    for (i, r) in replies.iter().enumerate() {
        let want = match i % 3 {
            0 => Reply::ok(),
            1 => Reply::Int(i as i64 / 3 + 1),
            _ => Reply::bulk(&format!("v{}", i / 3)),
        };
        assert_eq!(*r, want, "reply {i} of the pipeline");
    }
    assert_eq!(
        s.node.client().cmd(&["GET", "counter"]),
        Reply::bulk("333"),
        "1000 commands = 334 SETs, 333 INCRs, 333 GETs"
    );
    assert_eq!(s.node.dbsize(), 335);
}

#[test]
fn inline_commands_work_like_redis() {
    let Some(s) = single() else { return };
    for input in [
        &b"PING\r\n"[..],
        b"SET a b\r\n",
        b"GET a\r\n",
        b"SET \"x y\" \"hello world\"\r\nGET \"x y\"\r\n",
        b"EXISTS a nope\r\n",
        b"\r\nPING\r\n",
    ] {
        let mut p = s.proxy.client();
        let mut r = s.reference.client();
        p.send_raw(input);
        r.send_raw(input);
        let (pb, pc) = p.read_until_quiet(Duration::from_millis(300));
        let (rb, _) = r.read_until_quiet(Duration::from_millis(300));
        assert_eq!(
            String::from_utf8_lossy(&pb),
            String::from_utf8_lossy(&rb),
            "inline {:?}",
            String::from_utf8_lossy(input)
        );
        assert!(
            !pc,
            "the proxy closed the connection after inline {:?}",
            String::from_utf8_lossy(input)
        );
    }
    let mut n = s.node.client();
    assert_eq!(n.cmd(&["GET", "a"]), Reply::bulk("b"));
    assert_eq!(n.cmd(&["GET", "x y"]), Reply::bulk("hello world"));
}

#[test]
fn admin_endpoints_answer() {
    let Some(s) = single() else { return };
    s.proxy.client().cmd(&["SET", "a", "b"]);
    for path in ["/healthz", "/readyz"] {
        let (status, body) = s.proxy.admin_get(path);
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, body) = s.proxy.admin_get("/metrics");
    assert_eq!(status, 200, "/metrics: {body}");
    assert!(
        body.contains("# TYPE"),
        "/metrics is not Prometheus text:\n{body}"
    );
    let (status, _) = s.proxy.admin_get("/no-such-page");
    assert_eq!(status, 404);
}

#[test]
fn large_and_binary_values_round_trip() {
    let Some(s) = single() else { return };
    let mut p = s.proxy.client();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let weird_key: &[u8] = b"k\r\n\x00*1\r\n$4\r\nPING";
    let weird_val: &[u8] = b"\r\n-ERR not an error\r\n\x00\xff";
    assert_eq!(p.cmd(&[&b"SET"[..], b"big", &big]), Reply::ok());
    assert_eq!(p.cmd(&[&b"SET"[..], weird_key, weird_val]), Reply::ok());
    assert_eq!(p.cmd(&["GET", "big"]), Reply::Bulk(Some(big.clone())));
    assert_eq!(
        p.cmd(&[&b"GET"[..], weird_key]),
        Reply::Bulk(Some(weird_val.to_vec()))
    );
    assert_eq!(p.cmd(&["STRLEN", "big"]), Reply::Int(3_000_000));
    let mut n = s.node.client();
    assert_eq!(
        n.cmd(&[&b"GET"[..], weird_key]),
        Reply::Bulk(Some(weird_val.to_vec()))
    );
    assert_eq!(n.cmd(&["GET", "big"]), Reply::Bulk(Some(big.clone())));
    // Several big replies in one pipeline, interleaved with small ones.
    let cmds: Vec<Vec<&[u8]>> = (0..20)
        .map(|i| {
            if i % 2 == 0 {
                vec![&b"GET"[..], b"big"]
            } else {
                vec![&b"GET"[..], weird_key]
            }
        })
        .collect();
    for (i, r) in p.pipeline(&cmds).into_iter().enumerate() {
        let want = if i % 2 == 0 {
            big.clone()
        } else {
            weird_val.to_vec()
        };
        assert!(
            r == Reply::Bulk(Some(want)),
            "reply {i} of a pipeline of big values"
        );
    }
}

#[test]
fn a_command_sent_one_byte_at_a_time_is_not_an_error() {
    let Some(s) = single() else { return };
    let mut p = s.proxy.client();
    let bytes = [
        encode(&["SET", "slow", "drip"]),
        b"PING\r\n".to_vec(),
        encode(&["GET", "slow"]),
    ]
    .concat();
    for b in &bytes {
        p.send_raw(&[*b]);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(p.read_reply(), Reply::ok());
    assert_eq!(p.read_reply(), Reply::Simple("PONG".into()));
    assert_eq!(p.read_reply(), Reply::bulk("drip"));
}

#[test]
fn auth_with_a_proxy_password_behaves_like_requirepass() {
    need_redis();
    let node = Redis::start();
    let reference = Redis::start_with(&["--requirepass", "s3cret"]);
    let proxy = Proxy::start(&[&node], &["--password", "s3cret"]);
    let mut p = proxy.client();
    let mut r = reference.client();
    for args in [
        &["GET", "k"][..],
        &["SET", "k", "v"],
        &["AUTH", "wrong"],
        &["GET", "k"],
        &["AUTH", "s3cret"],
        &["SET", "k", "v"],
        &["GET", "k"],
    ] {
        let (got, want) = (p.cmd(args), r.cmd(args));
        assert_eq!(got, want, "{args:?} with a client password");
    }
    assert_eq!(node.client().cmd(&["GET", "k"]), Reply::bulk("v"));
    let mut h = proxy.client();
    let hello = h.cmd(&["HELLO", "3", "AUTH", "default", "s3cret"]);
    assert!(
        matches!(hello, Reply::Map(_)),
        "HELLO 3 AUTH default <password>: {hello}"
    );
    assert_eq!(h.cmd(&["GET", "k"]), Reply::bulk("v"));
}

#[test]
fn quit_and_reset_behave_like_redis() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    d.same(&["SELECT", "2"]);
    d.same(&["SET", "in2", "x"]);
    d.same(&["MULTI"]);
    d.same(&["RESET"]);
    d.same(&["GET", "in2"]); // back in db 0, out of the transaction
    d.same(&["QUIT"]);
    assert!(
        d.p.is_closed(),
        "the proxy kept the connection open after QUIT"
    );
    assert_eq!(s.node.client().cmd(&["SELECT", "2"]), Reply::ok());
}

#[test]
fn resp3_subscribers_get_push_messages() {
    let Some(s) = single() else { return };
    let mut d = Diff::new(&s);
    d.p.cmd(&["HELLO", "3"]);
    d.r.cmd(&["HELLO", "3"]);
    d.same(&["SUBSCRIBE", "ch"]);
    for server in [&s.node, &s.reference] {
        assert_eq!(server.client().cmd(&["PUBLISH", "ch", "m1"]), Reply::Int(1));
    }
    let (p, r) = (d.p.read_reply(), d.r.read_reply());
    assert_eq!(p, r, "RESP3 message");
    assert!(
        matches!(p, Reply::Push(_)),
        "a RESP3 subscriber gets a push: {p}"
    );
    // In RESP3 a subscribed client may run ordinary commands.
    d.same(&["SET", "k", "v"]);
    d.same(&["GET", "k"]);
    d.same(&["UNSUBSCRIBE", "ch"]);
}
