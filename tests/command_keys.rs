//! The command table checked against a real redis-server: key positions against
//! `COMMAND GETKEYS`, arity and flags against `COMMAND INFO`, error texts against the
//! server's own replies. Skips, loudly, only when `redis-server` is not installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use saltshaker::command::{classify, flags, lookup, KeySpec};

/// A redis-server on a free loopback port, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Option<Server> {
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let spawned = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("redis-server is not installed: the command table cannot be checked (scripts/install-deps.sh installs it)");
            }
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        let mut s = Server { child, port };
        // Another test may take the port between our check and the server's bind: the
        // server then exits, and what answers the port is not ours.
        std::thread::sleep(Duration::from_millis(100));
        if !matches!(s.child.try_wait(), Ok(None)) {
            let _ = s.child.kill();
            return Server::start();
        }
        Some(s)
    }

    fn connect(&self) -> Conn {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let mut conn = Conn {
                    reader: BufReader::new(stream),
                };
                // Ours: its process id is the child's.
                if let Value::Bulk(Some(info)) = conn.call(&[b"INFO", b"server"]) {
                    let pid = format!("process_id:{}", self.child.id());
                    if String::from_utf8_lossy(&info).contains(&pid) {
                        return conn;
                    }
                    panic!("another process answers port {}", self.port);
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

impl Value {
    fn items(&self) -> &[Value] {
        match self {
            Value::Array(Some(items)) => items,
            other => panic!("not an array: {other:?}"),
        }
    }
    fn text(&self) -> String {
        match self {
            Value::Simple(s) => s.clone(),
            Value::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("not a string: {other:?}"),
        }
    }
    fn int(&self) -> i64 {
        match self {
            Value::Int(n) => *n,
            other => panic!("not an integer: {other:?}"),
        }
    }
}

/// Just enough RESP2 to ask the server questions.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn call(&mut self, args: &[&[u8]]) -> Value {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&out).unwrap();
        self.read()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(line.ends_with("\r\n"), "short reply line {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    fn read(&mut self) -> Value {
        let line = self.line();
        let (kind, rest) = line.split_at(1);
        match kind {
            "+" => Value::Simple(rest.to_string()),
            "-" => Value::Error(rest.to_string()),
            ":" => Value::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Value::Bulk(None);
                }
                let mut buf = vec![0; n as usize + 2];
                self.reader.read_exact(&mut buf).unwrap();
                buf.truncate(n as usize);
                Value::Bulk(Some(buf))
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Value::Array(None);
                }
                Value::Array(Some((0..n).map(|_| self.read()).collect()))
            }
            _ => panic!("unexpected reply line {line:?}"),
        }
    }
}

/// Splits on spaces; `""` stands for an empty argument.
fn words(line: &str) -> Vec<&[u8]> {
    line.split_whitespace()
        .map(|w| if w == "\"\"" { &b""[..] } else { w.as_bytes() })
        .collect()
}

#[test]
fn every_command_of_command_info_is_known_with_its_arity_and_flags() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut conn = server.connect();
    let info = conn.call(&[b"COMMAND", b"INFO"]);
    let mut checked = 0;
    let mut stack: Vec<Value> = info.items().to_vec();
    while let Some(entry) = stack.pop() {
        let fields = entry.items();
        let name = fields[0].text();
        let spec = lookup(name.as_bytes()).unwrap_or_else(|| panic!("table lacks {name}"));
        assert_eq!(spec.arity as i64, fields[1].int(), "arity of {name}");
        let redis_flags: Vec<String> = fields[2].items().iter().map(Value::text).collect();
        let has = |f: &str| redis_flags.iter().any(|x| x == f);
        assert_eq!(spec.is_read(), has("readonly"), "readonly flag of {name}");
        assert_eq!(spec.is_write(), has("write"), "write flag of {name}");
        assert_eq!(
            spec.has(flags::BLOCKING),
            has("blocking"),
            "blocking flag of {name}"
        );
        assert_eq!(spec.has(flags::ADMIN), has("admin"), "admin flag of {name}");
        assert_eq!(
            spec.has(flags::PUBSUB),
            has("pubsub"),
            "pubsub flag of {name}"
        );
        assert_eq!(
            spec.has(flags::NOSCRIPT),
            has("noscript"),
            "noscript flag of {name}"
        );
        assert_eq!(spec.has(flags::FAST), has("fast"), "fast flag of {name}");
        assert_eq!(
            spec.has(flags::MOVABLE_KEYS),
            has("movablekeys"),
            "movablekeys of {name}"
        );
        let (first, last, step) = (fields[3].int(), fields[4].int(), fields[5].int());
        if let KeySpec::Range {
            first: f,
            last: l,
            step: s,
        } = spec.keys
        {
            if !has("movablekeys") {
                assert_eq!(
                    (f as i64, l as i64, s as i64),
                    (first, last, step),
                    "keys of {name}"
                );
            }
        }
        stack.extend(fields[9].items().iter().cloned());
        checked += 1;
    }
    assert!(checked > 350, "only {checked} commands checked");
}

/// Representative command lines of every family; distinct key names keep GETKEYS's
/// answer (names) comparable with ours (positions).
const LINES: &str = r#"
GET k1
SET k1 v
SET k1 v EX 10 NX GET
SETNX k1 v
SETEX k1 10 v
PSETEX k1 100 v
GETSET k1 v
GETDEL k1
GETEX k1 PERSIST
GETRANGE k1 0 1
SETRANGE k1 0 v
SUBSTR k1 0 1
APPEND k1 v
STRLEN k1
INCR k1
INCRBY k1 2
INCRBYFLOAT k1 1.5
DECR k1
DECRBY k1 2
MGET k1 k2 k3
MGET k1
MSET k1 v1 k2 v2
MSET k1 v1
MSETNX k1 v1 k2 v2 k3 v3
LCS k1 k2
LCS k1 k2 LEN
GETBIT k1 0
SETBIT k1 0 1
BITCOUNT k1
BITCOUNT k1 0 1 BIT
BITPOS k1 1
BITOP AND d k1 k2
BITOP NOT d k1
BITFIELD k1 GET u8 0
BITFIELD k1 SET u8 0 1 INCRBY u8 0 1
BITFIELD_RO k1 GET u8 0
DEL k1
DEL k1 k2 k3
UNLINK k1 k2
EXISTS k1 k2 k3
TOUCH k1 k2
TYPE k1
TTL k1
PTTL k1
EXPIRE k1 10
EXPIRE k1 10 NX
PEXPIRE k1 100
EXPIREAT k1 1
PEXPIREAT k1 1 GT
EXPIRETIME k1
PEXPIRETIME k1
PERSIST k1
RENAME k1 k2
RENAMENX k1 k2
COPY k1 k2
COPY k1 k2 DB 0 REPLACE
DUMP k1
RESTORE k1 0 x
RESTORE k1 0 x REPLACE ABSTTL
OBJECT ENCODING k1
OBJECT FREQ k1
OBJECT IDLETIME k1
OBJECT REFCOUNT k1
MEMORY USAGE k1
MEMORY USAGE k1 SAMPLES 5
MOVE k1 1
SORT k1
SORT k1 ALPHA DESC
SORT k1 STORE d
SORT k1 BY w GET g LIMIT 0 1 STORE d
SORT k1 GET # GET g STORE d
SORT_RO k1
SORT_RO k1 BY w GET g
MIGRATE h 1 k1 0 100
MIGRATE h 1 k1 0 100 COPY REPLACE
MIGRATE h 1 "" 0 100 KEYS k1 k2
MIGRATE h 1 "" 0 100 AUTH p KEYS k1 k2 k3
MIGRATE h 1 "" 0 100 AUTH2 u p KEYS k1
LPUSH k1 a b
RPUSH k1 a
LPUSHX k1 a
RPUSHX k1 a b
LPOP k1
LPOP k1 2
RPOP k1
LLEN k1
LINDEX k1 0
LINSERT k1 BEFORE a b
LRANGE k1 0 -1
LREM k1 0 a
LSET k1 0 a
LTRIM k1 0 1
LPOS k1 a RANK 1
LMOVE k1 k2 LEFT RIGHT
RPOPLPUSH k1 k2
LMPOP 1 k1 LEFT
LMPOP 2 k1 k2 LEFT COUNT 2
BLPOP k1 0
BLPOP k1 k2 k3 0
BRPOP k1 k2 0.5
BLMOVE k1 k2 LEFT LEFT 0
BRPOPLPUSH k1 k2 0
BLMPOP 0 2 k1 k2 RIGHT
BLMPOP 1 1 k1 LEFT COUNT 3
HSET k1 f v
HSET k1 f v f2 v2
HSETNX k1 f v
HGET k1 f
HMGET k1 f g
HMSET k1 f v
HGETALL k1
HKEYS k1
HVALS k1
HLEN k1
HDEL k1 f g
HEXISTS k1 f
HINCRBY k1 f 1
HINCRBYFLOAT k1 f 1.5
HSTRLEN k1 f
HRANDFIELD k1 2 WITHVALUES
HSCAN k1 0 MATCH x COUNT 10
SADD k1 a b
SREM k1 a
SMEMBERS k1
SISMEMBER k1 a
SMISMEMBER k1 a b
SCARD k1
SPOP k1
SPOP k1 2
SRANDMEMBER k1 2
SMOVE k1 k2 m
SINTER k1 k2 k3
SINTERSTORE d k1 k2
SUNION k1 k2
SUNIONSTORE d k1 k2 k3
SDIFF k1 k2
SDIFFSTORE d k1
SINTERCARD 2 k1 k2
SINTERCARD 3 k1 k2 k3 LIMIT 3
SSCAN k1 0
ZADD k1 1 a
ZADD k1 NX CH 1 a 2 b
ZCARD k1
ZCOUNT k1 0 1
ZINCRBY k1 1 a
ZSCORE k1 a
ZMSCORE k1 a b
ZRANK k1 a
ZREVRANK k1 a
ZRANGE k1 0 -1 WITHSCORES
ZRANGE k1 (1 +inf BYSCORE LIMIT 0 1
ZRANGE k1 + - BYLEX REV
ZRANGEBYSCORE k1 0 1 WITHSCORES LIMIT 0 1
ZREVRANGEBYSCORE k1 1 0
ZRANGEBYLEX k1 - +
ZREVRANGEBYLEX k1 + -
ZREVRANGE k1 0 1
ZLEXCOUNT k1 - +
ZREM k1 a b
ZREMRANGEBYRANK k1 0 1
ZREMRANGEBYSCORE k1 0 1
ZREMRANGEBYLEX k1 - +
ZPOPMIN k1
ZPOPMAX k1 2
BZPOPMIN k1 k2 0
BZPOPMAX k1 0
ZRANDMEMBER k1 2 WITHSCORES
ZRANGESTORE d k1 0 -1
ZUNION 2 k1 k2 WEIGHTS 1 2
ZUNION 1 k1
ZINTER 2 k1 k2 WITHSCORES
ZDIFF 2 k1 k2
ZUNIONSTORE d 2 k1 k2
ZUNIONSTORE d 1 k1 AGGREGATE SUM
ZINTERSTORE d 3 k1 k2 k3 AGGREGATE MAX
ZDIFFSTORE d 1 k1
ZDIFFSTORE d 2 k1 k2
ZINTERCARD 2 k1 k2
ZINTERCARD 1 k1 LIMIT 1
ZMPOP 2 k1 k2 MIN
ZMPOP 1 k1 MAX COUNT 2
BZMPOP 0 1 k1 MAX COUNT 2
BZMPOP 1.5 3 k1 k2 k3 MIN
ZSCAN k1 0
PFADD k1 a
PFADD k1
PFCOUNT k1
PFCOUNT k1 k2
PFMERGE d k1 k2
PFMERGE d
GEOADD k1 1 2 m
GEOADD k1 NX 1 2 m 3 4 n
GEODIST k1 a b
GEOHASH k1 a
GEOPOS k1 a b
GEORADIUS k1 1 2 3 m
GEORADIUS k1 1 2 3 m STORE d
GEORADIUS k1 1 2 3 m WITHDIST COUNT 2 STOREDIST d
GEORADIUS k1 1 2 3 m STORE d STOREDIST d2
GEORADIUSBYMEMBER k1 a 3 m
GEORADIUSBYMEMBER k1 a 3 m STORE d
GEORADIUSBYMEMBER k1 a 3 m ASC STOREDIST d
GEORADIUS_RO k1 1 2 3 m WITHCOORD
GEORADIUSBYMEMBER_RO k1 a 3 m
GEOSEARCH k1 FROMMEMBER a BYRADIUS 1 m
GEOSEARCH k1 FROMLONLAT 1 2 BYBOX 1 1 m ASC COUNT 1
GEOSEARCHSTORE d k1 FROMMEMBER a BYBOX 1 1 m
GEOSEARCHSTORE d k1 FROMLONLAT 1 2 BYRADIUS 1 m STOREDIST
XADD k1 * f v
XADD k1 MAXLEN ~ 10 * f v
XADD k1 NOMKSTREAM MINID 0 1-1 f v
XLEN k1
XRANGE k1 - +
XRANGE k1 - + COUNT 1
XREVRANGE k1 + -
XDEL k1 1-1
XTRIM k1 MAXLEN 10
XREAD STREAMS k1 0
XREAD COUNT 1 STREAMS k1 k2 0 0
XREAD COUNT 1 BLOCK 0 STREAMS k1 k2 0 0
XREAD BLOCK 100 STREAMS k1 $
XREADGROUP GROUP g c STREAMS k1 >
XREADGROUP GROUP g c COUNT 1 BLOCK 1 NOACK STREAMS k1 k2 > >
XREADGROUP GROUP g c NOACK STREAMS k1 k2 k3 0 0 0
XACK k1 g 1-1
XACK k1 g 1-1 2-1
XCLAIM k1 g c 0 1-1
XCLAIM k1 g c 0 1-1 2-1 JUSTID
XAUTOCLAIM k1 g c 0 0
XPENDING k1 g
XPENDING k1 g - + 10 c
XSETID k1 1-1
XGROUP CREATE k1 g $ MKSTREAM
XGROUP SETID k1 g $
XGROUP DESTROY k1 g
XGROUP CREATECONSUMER k1 g c
XGROUP DELCONSUMER k1 g c
XINFO STREAM k1
XINFO STREAM k1 FULL
XINFO GROUPS k1
XINFO CONSUMERS k1 g
EVAL s 0
EVAL s 0 a b
EVAL s 1 k1
EVAL s 2 k1 k2 a
EVALSHA h 1 k1
EVALSHA h 0 a
EVAL_RO s 1 k1 a
EVALSHA_RO h 0
EVALSHA_RO h 3 k1 k2 k3
FCALL f 2 k1 k2
FCALL f 0
FCALL_RO f 0 a
FCALL_RO f 1 k1 a
PUBLISH c m
SPUBLISH c m
SUBSCRIBE c
PSUBSCRIBE c*
SSUBSCRIBE c
UNSUBSCRIBE c
SUNSUBSCRIBE c
PUBSUB CHANNELS
PUBSUB NUMSUB c
WATCH k1
WATCH k1 k2
MULTI
EXEC
DISCARD
UNWATCH
PING
PING x
ECHO x
DBSIZE
KEYS *
SCAN 0
SCAN 0 MATCH x COUNT 10 TYPE string
RANDOMKEY
TIME
INFO
INFO server
CONFIG GET maxmemory
CONFIG SET maxmemory 0
FLUSHDB
FLUSHALL ASYNC
WAIT 0 0
CLIENT SETNAME x
CLIENT GETNAME
CLIENT ID
CLIENT LIST
CLIENT KILL ID 1
LASTSAVE
LOLWUT
COMMAND
COMMAND COUNT
COMMAND INFO get
SCRIPT EXISTS a b
SCRIPT LOAD x
SCRIPT FLUSH
FUNCTION LIST
FUNCTION DELETE lib
MEMORY STATS
SLOWLOG GET 10
LATENCY LATEST
SELECT 0
HELLO 3
AUTH p
QUIT
RESET
ROLE
SWAPDB 0 1
MONITOR
DEBUG SLEEP 0
CLUSTER INFO
ACL WHOAMI
"#;

/// Lines where `COMMAND GETKEYS` is wrong, with the keys the command really touches.
/// PFMERGE with only a destination: GETKEYS gives up because the second key spec
/// (the sources) is empty, yet the command writes the destination.
const GETKEYS_QUIRKS: &[(&str, &[&str])] = &[("PFMERGE d", &["d"])];

#[test]
fn keys_agree_with_command_getkeys() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut conn = server.connect();
    let (mut checked, mut wrong) = (0, vec![]);
    for line in LINES.lines().filter(|l| !l.trim().is_empty()) {
        let args = words(line);
        let ours = classify(&args[..]).unwrap_or_else(|e| panic!("{line}: {e}"));
        let ours: Vec<&[u8]> = ours.keys.iter().map(|&i| args[i as usize]).collect();
        let mut ask: Vec<&[u8]> = vec![b"COMMAND", b"GETKEYS"];
        ask.extend(&args);
        let reply = conn.call(&ask);
        let theirs: Vec<Vec<u8>> = match (GETKEYS_QUIRKS.iter().find(|(l, _)| *l == line), reply) {
            (Some((_, keys)), _) => keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            (None, Value::Array(Some(keys))) => keys
                .into_iter()
                .map(|k| match k {
                    Value::Bulk(Some(b)) => b,
                    other => panic!("{line}: odd key {other:?}"),
                })
                .collect(),
            // Keyless commands: "The command has no key arguments", "Invalid arguments..".
            (None, Value::Error(_)) => vec![],
            (None, other) => panic!("{line}: odd GETKEYS reply {other:?}"),
        };
        if ours != theirs {
            wrong.push(format!("{line}: ours {ours:?}, GETKEYS {theirs:?}"));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "keys differ:\n{}", wrong.join("\n"));
    assert!(checked > 300, "only {checked} lines checked");
}

/// Lines the server rejects before running anything: our error must read the same.
const BAD_LINES: &str = r#"
GET
GET a b
foo
foo a b
fOo a "" c
CLIENT foo
client Foo
CLIENT SETNAME
config
command foo
XINFO foo
object
MSET a b c
MSETNX a b c d e
EVAL s x
EVAL s 01 a
EVAL s -1
EVAL s 3 a
EVAL_RO s 5 a
ZUNION 0 a
ZUNION -1 a
ZUNION 3 a
ZUNION x a
ZUNIONSTORE d 0 a
ZUNIONSTORE d 3 a
ZDIFF 3 a
ZINTERCARD 0 a
ZINTERCARD x a
SINTERCARD 0 a
SINTERCARD x a
SINTERCARD 3 a
LMPOP 0 a LEFT
LMPOP x a LEFT
LMPOP 3 a LEFT
ZMPOP 3 a MIN
BLMPOP 0 3 a LEFT
BZMPOP 0 x a MIN
XREAD COUNT 1 a
XREAD STREAMS a b c
XREAD FOO STREAMS a 1
XREAD GROUP g c STREAMS a 1
XREAD NOACK STREAMS a 1
XREADGROUP GROUP g c STREAMS a b c
XREADGROUP COUNT 1 COUNT 2 STREAMS a 1
MIGRATE h 1 k 0 1 KEYS a
"#;

#[test]
fn errors_read_like_the_servers() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut conn = server.connect();
    let mut wrong = vec![];
    for line in BAD_LINES.lines().filter(|l| !l.trim().is_empty()) {
        let args = words(line);
        let ours = match classify(&args[..]) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("{line}: classified as {c:?}"),
        };
        match conn.call(&args) {
            Value::Error(theirs) if ours == theirs => {}
            other => wrong.push(format!("{line}: ours {ours:?}, server {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "errors differ:\n{}", wrong.join("\n"));
}
