//! Unit tests of the command table: routes, key positions, errors, lookup.

use super::*;

fn words(line: &str) -> Vec<&[u8]> {
    line.split(' ').map(str::as_bytes).collect()
}

fn ok(line: &str) -> Classified {
    match classify(&words(line)[..]) {
        Ok(c) => c,
        Err(e) => panic!("{line}: {e}"),
    }
}

fn err(line: &str) -> String {
    match classify(&words(line)[..]) {
        Ok(c) => panic!("{line}: classified as {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn keys(line: &str) -> Vec<u32> {
    ok(line).keys.to_vec()
}

fn route(line: &str) -> Route {
    ok(line).route
}

#[test]
fn single_key_commands_are_keyed_with_the_key_at_one() {
    for line in [
        "GET k",
        "SET k v EX 10",
        "INCR k",
        "HSET k f v",
        "ZADD k 1 m",
        "LPUSH k a b",
    ] {
        assert_eq!(route(line), Route::Keyed, "{line}");
        assert_eq!(keys(line), [1], "{line}");
    }
}

#[test]
fn names_are_case_insensitive() {
    assert_eq!(ok("get k").spec.name, "GET");
    assert_eq!(ok("gEt k").spec.name, "GET");
    assert_eq!(ok("client SetName x").spec.name, "CLIENT SETNAME");
    assert_eq!(
        lookup(b"hincrbyfloat").map(|s| s.name),
        Some("HINCRBYFLOAT")
    );
    assert_eq!(lookup(b"config get").map(|s| s.name), Some("CONFIG GET"));
    assert_eq!(lookup(b"CONFIG|SET").map(|s| s.name), Some("CONFIG SET"));
    assert_eq!(
        lookup_sub(b"object", b"Encoding").map(|s| s.name),
        Some("OBJECT ENCODING")
    );
    assert!(lookup(b"GETT").is_none());
    assert!(lookup(b"").is_none());
    assert!(lookup(&[b'A'; 300]).is_none());
}

#[test]
fn every_table_entry_is_found_by_its_own_name() {
    for spec in all() {
        let found = lookup(spec.name.to_ascii_lowercase().as_bytes());
        assert!(std::ptr::eq(found.unwrap(), spec), "{}", spec.name);
    }
    assert!(all().len() > 380);
}

#[test]
fn a_subcommand_name_is_not_a_top_level_command() {
    let args: Vec<&[u8]> = vec![b"CLIENT SETNAME", b"x"];
    assert!(matches!(classify(&args[..]), Err(CommandError::Unknown(_))));
}

#[test]
fn counters_are_flagged() {
    for name in [
        "INCR",
        "INCRBY",
        "DECR",
        "DECRBY",
        "INCRBYFLOAT",
        "HINCRBY",
        "HINCRBYFLOAT",
    ] {
        assert!(
            lookup(name.as_bytes()).unwrap().has(flags::COUNTER),
            "{name}"
        );
    }
    assert!(!lookup(b"ZINCRBY").unwrap().has(flags::COUNTER));
    assert!(lookup(b"GET").unwrap().is_read());
    assert!(lookup(b"SET").unwrap().is_write());
}

#[test]
fn multi_key_commands_split_or_stay_whole() {
    assert_eq!(route("MGET a b c"), Route::Split(Split::Mget));
    assert_eq!(keys("MGET a b c"), [1, 2, 3]);
    assert_eq!(route("MSET a 1 b 2"), Route::Split(Split::Mset));
    assert_eq!(keys("MSET a 1 b 2"), [1, 3]);
    assert_eq!(route("DEL a b"), Route::Split(Split::SumInt));
    assert_eq!(route("EXISTS a"), Route::Split(Split::SumInt));
    assert_eq!(route("RENAME a b"), Route::Keyed);
    assert_eq!(keys("RENAME a b"), [1, 2]);
    assert_eq!(keys("SMOVE a b m"), [1, 2]);
    assert_eq!(keys("BITOP AND d a b"), [2, 3, 4]);
    assert_eq!(keys("MSETNX a 1 b 2"), [1, 3]);
    assert_eq!(keys("LMOVE a b LEFT RIGHT"), [1, 2]);
    assert_eq!(keys("PFMERGE d"), [1]);
    let args = words("SUNIONSTORE d a b");
    let c = classify(&args[..]).unwrap();
    assert_eq!(c.key(&args[..], 0), Some(&b"d"[..]));
    assert_eq!(c.key(&args[..], 2), Some(&b"b"[..]));
    assert_eq!(c.key(&args[..], 3), None);
}

#[test]
fn mset_with_a_missing_value_is_an_arity_error() {
    assert_eq!(
        err("MSET a 1 b"),
        "ERR wrong number of arguments for 'mset' command"
    );
    assert_eq!(
        err("msetnx a 1 b"),
        "ERR wrong number of arguments for 'msetnx' command"
    );
}

#[test]
fn arity_errors_use_the_redis_full_name() {
    assert_eq!(
        err("GET"),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        err("get a b"),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        err("CLIENT SETNAME"),
        "ERR wrong number of arguments for 'client|setname' command"
    );
    assert_eq!(
        err("config"),
        "ERR wrong number of arguments for 'config' command"
    );
    assert_eq!(
        err("XREAD STREAMS a"),
        "ERR wrong number of arguments for 'xread' command"
    );
}

#[test]
fn unknown_commands_echo_name_and_args_like_redis() {
    assert_eq!(
        err("foo a b"),
        "ERR unknown command 'foo', with args beginning with: 'a' 'b' "
    );
    assert_eq!(
        err("foo"),
        "ERR unknown command 'foo', with args beginning with: "
    );
    let long = format!("foo {} b", "x".repeat(200));
    assert_eq!(
        err(&long),
        format!(
            "ERR unknown command 'foo', with args beginning with: '{}' ",
            "x".repeat(128)
        )
    );
    let args: Vec<&[u8]> = vec![b"fo\r\no", b"a\0b"];
    let e = classify(&args[..]).unwrap_err().to_string();
    assert_eq!(
        e,
        "ERR unknown command 'fo  o', with args beginning with: 'a' "
    );
    let empty: Vec<&[u8]> = vec![];
    assert!(classify(&empty[..]).is_err());
}

#[test]
fn unknown_subcommands_name_the_container_in_upper_case() {
    assert_eq!(
        err("CLIENT foo"),
        "ERR unknown subcommand 'foo'. Try CLIENT HELP."
    );
    assert_eq!(
        err("client Foo"),
        "ERR unknown subcommand 'Foo'. Try CLIENT HELP."
    );
    assert_eq!(
        err("command foo"),
        "ERR unknown subcommand 'foo'. Try COMMAND HELP."
    );
    assert_eq!(
        err("XINFO foo"),
        "ERR unknown subcommand 'foo'. Try XINFO HELP."
    );
}

#[test]
fn subcommands_resolve_with_their_own_keys_and_routes() {
    assert_eq!(ok("CLIENT SETNAME x").route, Route::Local);
    assert_eq!(route("CLIENT UNBLOCK 1"), Route::Local);
    assert!(matches!(route("ACL SAVE"), Route::Unsupported(_)));
    assert_eq!(route("CLIENT KILL ID 1"), Route::Local);
    assert_eq!(route("CONFIG GET maxmemory"), Route::AllNodes(Agg::First));
    assert_eq!(route("CONFIG SET maxmemory 1"), Route::AllNodes(Agg::AllOk));
    assert_eq!(route("SCRIPT EXISTS a b"), Route::AllNodes(Agg::AndArrays));
    assert_eq!(route("SCRIPT LOAD x"), Route::AllNodes(Agg::AllOk));
    assert_eq!(route("FUNCTION LIST"), Route::AllNodes(Agg::First));
    assert_eq!(keys("OBJECT ENCODING k"), [2]);
    assert_eq!(keys("MEMORY USAGE k SAMPLES 5"), [2]);
    assert_eq!(keys("XINFO STREAM s"), [2]);
    assert_eq!(keys("XGROUP CREATE s g $"), [2]);
    assert_eq!(route("MEMORY STATS"), Route::AnyNode);
    // COMMAND says what the proxy serves (`proxy::answer::command`); GETKEYS asks a node.
    assert_eq!(route("COMMAND"), Route::Local);
    assert_eq!(route("COMMAND COUNT"), Route::Local);
    assert_eq!(route("COMMAND GETKEYS GET k"), Route::AnyNode);
    assert_eq!(route("PUBSUB CHANNELS"), Route::AnyNode);
    // The proxy shows itself as a one-node cluster; it does not run the real one's admin.
    assert_eq!(route("CLUSTER INFO"), Route::Local);
    assert_eq!(route("CLUSTER SLOTS"), Route::Local);
    assert!(matches!(route("CLUSTER ADDSLOTS 1"), Route::Unsupported(_)));
}

#[test]
fn keyless_routes() {
    assert_eq!(route("PING"), Route::Local);
    assert_eq!(route("INFO"), Route::Local);
    assert_eq!(route("TIME"), Route::AnyNode);
    assert_eq!(route("PUBLISH c m"), Route::AnyNode);
    assert_eq!(route("DBSIZE"), Route::AllNodes(Agg::SumInt));
    assert_eq!(route("FLUSHALL"), Route::AllNodes(Agg::AllOk));
    assert_eq!(route("KEYS *"), Route::AllNodes(Agg::ConcatArrays));
    assert_eq!(route("WAIT 1 0"), Route::AllNodes(Agg::MinInt));
    assert_eq!(route("SCAN 0"), Route::Scan);
    assert_eq!(route("RANDOMKEY"), Route::RandomKey);
    assert_eq!(route("MULTI"), Route::Transaction);
    assert_eq!(route("WATCH a b"), Route::Transaction);
    assert_eq!(keys("WATCH a b"), [1, 2]);
    assert_eq!(route("SUBSCRIBE c"), Route::Subscribe);
    assert_eq!(route("SSUBSCRIBE c"), Route::Subscribe);
    assert_eq!(route("MONITOR"), Route::Local);
    assert_eq!(
        route("SAVE"),
        Route::Unsupported(
            "SAVE is refused through the proxy: persistence is per node. Run it on each node directly"
        )
    );
    assert!(matches!(route("MOVE k 1"), Route::Unsupported(_)));
}

#[test]
fn blocking_commands_get_a_dedicated_connection() {
    assert_eq!(route("BLPOP a b 0"), Route::Blocking);
    assert_eq!(keys("BLPOP a b 0"), [1, 2]);
    assert_eq!(route("BZPOPMIN a 0"), Route::Blocking);
    assert_eq!(route("BLMPOP 0 2 a b LEFT"), Route::Blocking);
    assert_eq!(keys("BLMPOP 0 2 a b LEFT"), [3, 4]);
    assert_eq!(route("BRPOPLPUSH a b 0"), Route::Blocking);
}

#[test]
fn xread_blocks_only_with_block() {
    assert_eq!(route("XREAD COUNT 2 STREAMS a b 0 0"), Route::Keyed);
    assert_eq!(keys("XREAD COUNT 2 STREAMS a b 0 0"), [4, 5]);
    assert_eq!(route("XREAD BLOCK 0 STREAMS a $"), Route::Blocking);
    assert_eq!(keys("xread block 0 streams a $"), [4]);
    assert_eq!(route("XREADGROUP GROUP g c STREAMS a >"), Route::Keyed);
    assert_eq!(keys("XREADGROUP GROUP g c STREAMS a >"), [5]);
    assert_eq!(
        route("XREADGROUP GROUP g c BLOCK 10 NOACK STREAMS a b > >"),
        Route::Blocking
    );
    assert_eq!(
        keys("XREADGROUP GROUP g c BLOCK 10 NOACK STREAMS a b > >"),
        [8, 9]
    );
}

#[test]
fn xread_errors_match_the_server() {
    let unbalanced =
        "ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.";
    assert_eq!(err("XREAD STREAMS a b c"), unbalanced);
    assert_eq!(err("XREADGROUP GROUP g c STREAMS a b c"), unbalanced);
    assert_eq!(err("XREAD COUNT 1 a"), "ERR syntax error");
    assert_eq!(err("XREAD FOO STREAMS a 1"), "ERR syntax error");
    assert_eq!(
        err("XREAD GROUP g c STREAMS a 1"),
        "ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead."
    );
    assert_eq!(
        err("XREADGROUP COUNT 1 COUNT 2 STREAMS a 1"),
        "ERR Missing GROUP option for XREADGROUP"
    );
}

#[test]
fn sort_with_store_has_two_keys() {
    assert_eq!(keys("SORT k"), [1]);
    assert_eq!(keys("SORT k BY w_* GET o_* LIMIT 0 10 STORE dst"), [1, 10]);
    assert_eq!(keys("SORT k STORE a STORE b"), [1, 5]);
    assert_eq!(keys("SORT_RO k BY w_* GET o_*"), [1]);
    assert_eq!(route("SORT k STORE d"), Route::Keyed);
}

#[test]
fn eval_routes_by_numkeys() {
    assert_eq!(route("EVAL s 0"), Route::AnyNode);
    assert!(keys("EVAL s 0 a b").is_empty());
    assert_eq!(route("EVAL s 2 a b x"), Route::Keyed);
    assert_eq!(keys("EVAL s 2 a b x"), [3, 4]);
    assert_eq!(keys("EVALSHA_RO h 1 a"), [3]);
    assert_eq!(route("FCALL f 0 x"), Route::AnyNode);
    assert_eq!(keys("FCALL_RO f 1 k x"), [3]);
}

#[test]
fn numkeys_errors_match_the_server() {
    let not_int = "ERR value is not an integer or out of range";
    let too_many = "ERR Number of keys can't be greater than number of args";
    let positive = "ERR numkeys should be greater than 0";
    assert_eq!(err("EVAL s x"), not_int);
    assert_eq!(err("EVAL s 01 a"), not_int);
    assert_eq!(err("EVAL s +1 a"), not_int);
    assert_eq!(err("EVAL s -1"), "ERR Number of keys can't be negative");
    assert_eq!(err("EVAL s 3 a"), too_many);
    assert_eq!(err("FCALL f x a"), "ERR Bad number of keys provided");
    assert_eq!(
        err("ZUNION 0 a"),
        "ERR at least 1 input key is needed for 'zunion' command"
    );
    assert_eq!(
        err("ZUNIONSTORE d -1 a"),
        "ERR at least 1 input key is needed for 'zunionstore' command"
    );
    assert_eq!(err("ZUNION 3 a"), "ERR syntax error");
    assert_eq!(err("ZINTERCARD x a"), not_int);
    assert_eq!(err("SINTERCARD 0 a"), positive);
    assert_eq!(err("SINTERCARD x a"), positive);
    assert_eq!(err("SINTERCARD 3 a"), too_many);
    assert_eq!(err("LMPOP 3 a LEFT"), "ERR syntax error");
    assert_eq!(err("LMPOP -1 a LEFT"), positive);
    assert_eq!(err("BZMPOP 0 x a MIN"), positive);
    assert_eq!(err("ZMPOP 99999999999999999999 a MIN"), positive);
}

#[test]
fn numkeys_commands_list_their_keys() {
    assert_eq!(keys("ZUNIONSTORE d 2 a b WEIGHTS 1 2"), [1, 3, 4]);
    assert_eq!(keys("ZDIFF 2 a b"), [2, 3]);
    assert_eq!(keys("SINTERCARD 2 a b LIMIT 1"), [2, 3]);
    assert_eq!(keys("LMPOP 1 a LEFT"), [2]);
    assert_eq!(keys("ZINTERCARD 5 a b c d e"), [2, 3, 4, 5, 6]);
}

#[test]
fn migrate_and_georadius_keys() {
    assert_eq!(keys("MIGRATE h 1 k 0 1"), [3]);
    assert_eq!(keys("MIGRATE h 1  0 1 COPY AUTH2 u p KEYS a b"), [11, 12]);
    assert_eq!(
        err("MIGRATE h 1 k 0 1 KEYS a"),
        "ERR When using MIGRATE KEYS option, the key argument must be set to the empty string"
    );
    assert_eq!(keys("GEORADIUS k 1 2 3 m"), [1]);
    assert_eq!(keys("GEORADIUS k 1 2 3 m STORE d"), [1, 7]);
    assert_eq!(keys("GEORADIUSBYMEMBER k m 3 km STOREDIST d"), [1, 6]);
    assert_eq!(keys("GEORADIUS_RO k 1 2 3 m"), [1]);
}

#[test]
fn newer_commands_are_known() {
    assert_eq!(keys("HEXPIRE h 10 FIELDS 1 f"), [1]);
    assert_eq!(keys("HTTL h FIELDS 1 f"), [1]);
    assert_eq!(route("CLIENT NO-TOUCH ON"), Route::Local);
    assert_eq!(route("CLIENT SETINFO LIB-NAME x"), Route::Local);
    assert_eq!(route("WAITAOF 1 0 0"), Route::AllNodes(Agg::MinInt));
}

#[test]
fn parse_i64_follows_string2ll() {
    use super::keys::parse_i64;
    assert_eq!(parse_i64(b"0"), Some(0));
    assert_eq!(parse_i64(b"-5"), Some(-5));
    assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    for bad in [
        &b""[..],
        b"-",
        b"-0",
        b"00",
        b"01",
        b"+1",
        b" 1",
        b"1 ",
        b"9223372036854775808",
    ] {
        assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn vec_of_vec_args_work() {
    let args: Vec<Vec<u8>> = vec![b"get".to_vec(), b"k".to_vec()];
    assert_eq!(classify(&args).unwrap().keys.to_vec(), [1]);
    assert_eq!(classify(&args[..]).unwrap().keys.to_vec(), [1]);
}

#[test]
fn no_argument_list_makes_classify_panic() {
    const TOKENS: [&[u8]; 16] = [
        b"",
        b"0",
        b"1",
        b"2",
        b"-1",
        b"x",
        b"STREAMS",
        b"BLOCK",
        b"GROUP",
        b"NOACK",
        b"STORE",
        b"KEYS",
        b"LIMIT",
        b"AUTH2",
        b"99999999999999999999",
        b"STOREDIST",
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for spec in all() {
        let name: Vec<&[u8]> = spec.name.split(' ').map(str::as_bytes).collect();
        for _ in 0..200 {
            let mut args = name.clone();
            for _ in 0..next() % 9 {
                args.push(TOKENS[(next() % TOKENS.len() as u64) as usize]);
            }
            if let Ok(c) = classify(&args[..]) {
                assert!(
                    c.keys.iter().all(|&k| (k as usize) < args.len()),
                    "{args:?}"
                );
            }
        }
    }
}

#[test]
#[ignore = "timing; run: cargo test --release -- --ignored classify_is_fast"]
fn classify_is_fast() {
    use std::hint::black_box;
    use std::time::Instant;
    // The best of many short batches: other processes on a shared machine only add time.
    fn ns_per_call(line: &str) -> f64 {
        let args = words(line);
        let (batches, rounds) = (400, 5_000);
        let mut sink = 0;
        let mut best = f64::MAX;
        for _ in 0..batches {
            let start = Instant::now();
            for _ in 0..rounds {
                sink += classify(black_box(&args[..])).map_or(0, |c| c.keys.len());
            }
            best = best.min(start.elapsed().as_nanos() as f64 / rounds as f64);
        }
        black_box(sink);
        eprintln!("classify({line}): {best:.1} ns");
        best
    }
    let get = ns_per_call("GET some:key:1234");
    ns_per_call("get some:key:1234");
    ns_per_call("HINCRBY h f 1");
    ns_per_call("MGET a b c d");
    ns_per_call("EVALSHA 0123456789abcdef 2 a b");
    ns_per_call("XREAD COUNT 10 BLOCK 0 STREAMS a b $ $");
    ns_per_call("CLIENT SETNAME x");
    if !cfg!(debug_assertions) {
        assert!(get < 40.0, "classify(GET key) took {get:.1} ns");
    }
}

#[test]
fn an_integer_increment_is_typed_once_with_redis_s_errors() {
    let counter = |line: &str| ok(line).counter;
    let by = |d: i64, field: Option<u32>| {
        Some(Counter {
            delta: Ok(d),
            field,
        })
    };
    assert_eq!(counter("INCR k"), by(1, None));
    assert_eq!(counter("DECR k"), by(-1, None));
    assert_eq!(counter("INCRBY k 7"), by(7, None));
    assert_eq!(counter("DECRBY k 5"), by(-5, None));
    assert_eq!(counter("HINCRBY h f -3"), by(-3, Some(2)));
    let not_int = Some(Counter {
        delta: Err(NOT_AN_INTEGER),
        field: None,
    });
    assert_eq!(counter("INCRBY k x"), not_int);
    assert_eq!(counter("INCRBY k 01"), not_int);
    assert_eq!(
        counter("DECRBY k -9223372036854775808").map(|c| c.delta),
        Some(Err("ERR decrement would overflow"))
    );
    assert_eq!(counter("INCRBYFLOAT k 1.5"), None);
    assert_eq!(counter("GET k"), None);
    assert_eq!(ok("GET k").access, Access::Read);
    assert_eq!(ok("SET k v").access, Access::Write);
    assert_eq!(ok("PING").access, Access::Other);
}
