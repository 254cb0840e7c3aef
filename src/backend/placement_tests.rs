use super::*;

fn nodes(specs: &[(&str, u32)]) -> Vec<NodeSpec> {
    specs
        .iter()
        .map(|&(name, weight)| NodeSpec {
            name: name.to_string(),
            weight,
        })
        .collect()
}

fn ketama(hash: HashFn, specs: &[(&str, u32)]) -> Placement {
    Placement::new(Distribution::Ketama, hash, None, &nodes(specs))
}

const KEYS: [&str; 8] = [
    "user:1",
    "user:2",
    "user:3",
    "session:abc",
    "foo",
    "bar",
    "baz",
    "qux",
];

/// Expected nodes come from twemproxy's `ketama_update`/`ketama_dispatch` compiled with gcc.
#[test]
fn ketama_matches_twemproxy_reference_placements() {
    // (hash, nodes, expected node per key, continuum points)
    type Case<'a> = (HashFn, &'a [(&'a str, u32)], [usize; 8], usize);
    let cases: [Case; 3] = [
        (
            HashFn::Fnv1a_64,
            &[
                ("10.0.0.1:6379", 1),
                ("10.0.0.2:6379", 2),
                ("10.0.0.3:6379", 3),
                ("10.0.0.4:6379", 5),
            ],
            [2, 2, 2, 3, 1, 3, 3, 3],
            632,
        ),
        (
            HashFn::Md5,
            &[
                ("10.0.0.1:6379", 1),
                ("10.0.0.2:6379", 1),
                ("10.0.0.3:6379", 1),
            ],
            [0, 2, 1, 1, 2, 2, 2, 1],
            480,
        ),
        (
            HashFn::Murmur,
            &[("redis-a", 1), ("redis-b", 1), ("x", 2)],
            [0, 2, 1, 2, 2, 0, 2, 1],
            480,
        ),
    ];
    for (hash, specs, expected, points) in cases {
        let p = ketama(hash, specs);
        assert_eq!(p.continuum_len(), points, "{hash}");
        let got: Vec<usize> = KEYS.iter().map(|k| p.node_for(k.as_bytes())).collect();
        assert_eq!(got, expected, "{hash} over {specs:?}");
    }
}

#[test]
fn long_names_are_cut_like_twemproxys_86_byte_buffer() {
    let long = "n".repeat(83); // "name-10" and up no longer fit
    let p = ketama(HashFn::Md5, &[(&long, 1), ("short", 1)]);
    let got: String = (0..64)
        .map(|i| char::from(b'0' + p.node_for(format!("k{i}").as_bytes()) as u8))
        .collect();
    assert_eq!(
        got,
        "0001111001111110101010111100011100111110001110110110111110111110"
    );
}

#[test]
fn weights_scale_the_share_of_keys() {
    let p = ketama(HashFn::Md5, &[("a:1", 1), ("b:1", 3)]);
    let mut count = [0u32; 2];
    for i in 0..20_000 {
        count[p.node_for(format!("key:{i}").as_bytes())] += 1;
    }
    let share = f64::from(count[1]) / 20_000.0;
    assert!((0.70..0.80).contains(&share), "heavy node got {share}");
}

#[test]
fn modula_slots_follow_twemproxys_name_order() {
    // Sorted as twemproxy sorts: shorter names first, then bytewise: "zz", "aaa", "bbb".
    let specs = [("bbb", 2), ("zz", 1), ("aaa", 1)];
    let p = Placement::new(Distribution::Modula, HashFn::Md5, None, &nodes(&specs));
    let slots: Vec<usize> = (0..8).map(|h| p.node_for_hash(h)).collect();
    assert_eq!(slots, [1, 2, 0, 0, 1, 2, 0, 0]);
}

#[test]
fn hash_tag_takes_the_first_non_empty_pair() {
    let tag = Some(*b"{}");
    assert_eq!(hash_tag(b"user:{42}:name", tag), b"42");
    assert_eq!(hash_tag(b"{a}{b}", tag), b"a");
    assert_eq!(hash_tag(b"a{}b", tag), b"a{}b");
    assert_eq!(hash_tag(b"{}{x}", tag), b"{}{x}");
    assert_eq!(hash_tag(b"open{only", tag), b"open{only");
    assert_eq!(hash_tag(b"x}y{z}", tag), b"z");
    assert_eq!(hash_tag(b"{{a}}", tag), b"{a");
    assert_eq!(hash_tag(b"user:{42}:name", None), b"user:{42}:name");
    assert_eq!(hash_tag(b"$abc$def", Some(*b"$$")), b"abc");
}

#[test]
fn tagged_keys_share_a_node() {
    let p = Placement::new(
        Distribution::Ketama,
        HashFn::Fnv1a_64,
        Some(*b"{}"),
        &nodes(&[("a:1", 1), ("b:1", 1), ("c:1", 1), ("d:1", 1)]),
    );
    let home = p.node_for(b"{cart:7}");
    for k in ["{cart:7}:items", "x{cart:7}", "{cart:7}{other}"] {
        assert_eq!(p.node_for(k.as_bytes()), home, "{k}");
    }
}

#[test]
fn empty_key_single_node_and_empty_pool_do_not_panic() {
    let four = ketama(
        HashFn::Murmur,
        &[("a:1", 1), ("b:1", 1), ("c:1", 1), ("d:1", 1)],
    );
    assert_eq!(four.node_for(b""), four.node_for_hash(0));
    assert_eq!(
        ketama(HashFn::Md5, &[("only:1", 7)]).node_for(b"anything"),
        0
    );
    let empty = Placement::new(Distribution::Modula, HashFn::Md5, None, &[]);
    assert!(empty.is_empty());
    assert_eq!(empty.node_for(b"k"), 0);
    let zero = Placement::new(
        Distribution::Ketama,
        HashFn::Md5,
        None,
        &nodes(&[("a", 0), ("b", 0)]),
    );
    assert!(zero.node_for(b"k") < 2);
}

#[test]
fn random_stays_in_range_and_spreads() {
    let p = Placement::new(
        Distribution::Random,
        HashFn::Md5,
        None,
        &nodes(&[("a", 1), ("b", 1), ("c", 1)]),
    );
    let mut seen = [0u32; 3];
    for _ in 0..3000 {
        seen[p.node_for(b"same key")] += 1;
    }
    assert!(seen.iter().all(|&n| n > 700), "{seen:?}");
}

#[test]
fn server_lines_name_nodes_as_twemproxy_does() {
    let ok = |s: &str| parse_server(s).unwrap_or_else(|e| panic!("{e}"));
    let node = |name: &str, weight| NodeSpec {
        name: name.into(),
        weight,
    };
    assert_eq!(
        ok("127.0.0.1:6379:1"),
        ("127.0.0.1:6379".into(), node("127.0.0.1:6379", 1))
    );
    assert_eq!(
        ok("127.0.0.1:6379:3 cache-a"),
        ("127.0.0.1:6379".into(), node("cache-a", 3))
    );
    assert_eq!(
        ok("redis.local:6380"),
        ("redis.local:6380".into(), node("redis.local:6380", 1))
    );
    // libmemcached's convention: port 11211 is left out of the hashed name.
    assert_eq!(
        ok("10.0.0.1:11211:2"),
        ("10.0.0.1:11211".into(), node("10.0.0.1", 2))
    );
    assert_eq!(ok("::1:6379:1"), ("::1:6379".into(), node("::1:6379", 1)));
    assert_eq!(
        ok("h:06379:1").1.name,
        "h:06379",
        "the name keeps the port as written"
    );
    for bad in [
        "host",
        "host:0:1",
        "host:65536:1",
        "host:6379:0",
        "host:abc:1",
        "host:6379:+1",
        "host:6379:1 ",
        ":6379:1",
        "/tmp/redis.sock:1",
        "host:6379:99999999999",
    ] {
        assert!(parse_server(bad).is_err(), "{bad:?} should be refused");
    }
}

#[test]
fn check_nodes_refuses_what_twemproxy_refuses() {
    assert!(check_nodes(&nodes(&[("a", 1), ("b", 2)])).is_ok());
    assert!(check_nodes(&nodes(&[("a", 1), ("a", 2)])).is_err());
    assert!(check_nodes(&nodes(&[("a", 0)])).is_err());
}

#[test]
fn distribution_names_parse() {
    assert_eq!("ketama".parse(), Ok(Distribution::Ketama));
    assert_eq!("modula".parse(), Ok(Distribution::Modula));
    assert_eq!("random".parse(), Ok(Distribution::Random));
    assert!("Ketama".parse::<Distribution>().is_err());
}

/// Cost of `node_for` on the hot path; run with
/// `cargo test --release --lib node_for_cost -- --ignored --nocapture`.
/// Counts the thread's on-CPU time where Linux reports it, so a loaded machine
/// inflates the figure less than wall time would.
#[test]
#[ignore]
fn node_for_cost() {
    fn cpu_ns() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        s.split_whitespace().next()?.parse().ok()
    }
    fn per_call(keys: &[Vec<u8>], mut f: impl FnMut(&[u8]) -> usize) -> f64 {
        let rounds = 400;
        let (wall, cpu) = (std::time::Instant::now(), cpu_ns());
        let mut acc = 0usize;
        for _ in 0..rounds {
            for k in keys {
                acc = acc.wrapping_add(f(std::hint::black_box(k)));
            }
        }
        std::hint::black_box(acc);
        let spent = match (cpu, cpu_ns()) {
            (Some(a), Some(b)) => (b - a) as f64,
            _ => wall.elapsed().as_nanos() as f64,
        };
        spent / (rounds * keys.len()) as f64
    }
    let specs: Vec<(String, u32)> = (0..16).map(|i| (format!("10.0.0.{i}:6379"), 1)).collect();
    let specs: Vec<(&str, u32)> = specs.iter().map(|(n, w)| (n.as_str(), *w)).collect();
    let keys: Vec<Vec<u8>> = (0..4096)
        .map(|i| format!("user:{i:05}:profile").into_bytes())
        .collect();
    for f in [HashFn::Fnv1a_64, HashFn::Murmur, HashFn::Md5] {
        let p = Placement::new(Distribution::Ketama, f, Some(*b"{}"), &nodes(&specs));
        let hash_only = per_call(&keys, |k| hash(f, k) as usize);
        let full = per_call(&keys, |k| p.node_for(k));
        println!("ketama/{f}, 16 nodes, 18-byte keys: node_for {full:.1} ns, of which hash {hash_only:.1} ns");
    }
}
