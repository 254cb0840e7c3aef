//! Rules as an SRE meets them: shipped files, located errors, merging, first match wins.

use super::*;

const ISSUE: &str = r#"version: 1
detection: { window_ms: 1000, top_k: 64 }
epoch_ms: 5000
defaults:
  read:  { hot_at_per_sec: 2000, cool_below_per_sec: 500,
           cache: { enabled: true, ttl_ms: 1000, jitter_pct: 20, stale_while_revalidate_ms: 250 } }
  write: { hot_at_per_sec: 2000, cool_below_per_sec: 500,
           strategy: auto,            # off | combine | salt | salt+combine | auto
           combine: { window_us: 500 },
           salt: { shards: auto, per_shard_per_sec: 1000, max_shards: 64, families: [counters, hashes] } }
rules:                                # first match wins; glob patterns
  - match: "likes:*"
    write: { strategy: salt, salt: { shards: 8 } }
  - match: "lock:*"
    write: { strategy: off }
    read:  { cache: { enabled: false } }
  - match: "vote:final"
    pin: true                         # treat as hot from the start (a known event)
"#;

fn err(text: &str) -> ConfigError {
    match Rules::parse(text, "r.yaml") {
        Ok(r) => panic!("accepted: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn default_file_is_the_builtin_default() {
    let shipped = Rules::parse(include_str!("../../rules/default.yaml"), "default.yaml").unwrap();
    assert_eq!(shipped, Rules::default());
}

#[test]
fn shipped_examples_parse() {
    for (name, text) in [
        (
            "viral-counters",
            include_str!("../../rules/examples/viral-counters.yaml"),
        ),
        (
            "read-heavy-profiles",
            include_str!("../../rules/examples/read-heavy-profiles.yaml"),
        ),
        (
            "televised-vote",
            include_str!("../../rules/examples/televised-vote.yaml"),
        ),
        (
            "admission",
            include_str!("../../rules/examples/admission.yaml"),
        ),
    ] {
        let r = Rules::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
        assert!(!r.rules().is_empty(), "{name}");
    }
    // The deep read cache is all defaults; the detector must really track that many keys.
    let deep = Rules::parse(
        include_str!("../../rules/examples/zipf-read-cache.yaml"),
        "z",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(deep.top_k(), 8192);
    assert!(deep.top_k() <= crate::hotkey::MAX_TOP_K);
    assert_eq!(deep.defaults().read.hot_at_per_sec, 2.0);
    let vote = Rules::parse(
        include_str!("../../rules/examples/televised-vote.yaml"),
        "v",
    )
    .unwrap();
    assert_eq!(vote.pinned(), ["vote:final:*", "vote:final"]);
}

#[test]
fn issue_example_resolves_as_described() {
    let r = Rules::parse(ISSUE, "r.yaml").unwrap();
    let likes = r.resolve(b"likes:42");
    assert_eq!(likes.rule, Some(0));
    assert_eq!(
        (likes.write.strategy, likes.write.salt.shards),
        (Strategy::Salt, Shards::Fixed(8))
    );
    assert_eq!(
        likes.write.salt.max_shards, 64,
        "nested fields not given are inherited"
    );
    assert_eq!(likes.read, r.defaults().read);
    let lock = r.resolve(b"lock:order:7");
    assert_eq!(
        (lock.rule, lock.write.strategy, lock.read.cache.enabled),
        (Some(1), Strategy::Off, false)
    );
    assert_eq!(lock.read.cache.ttl_ms, 1000);
    let vote = r.resolve(b"vote:final");
    assert!(vote.pin && vote.rule == Some(2));
    let other = r.resolve(b"profile:1");
    assert_eq!(
        (other.rule, other.pin, other.write),
        (None, false, r.defaults().write)
    );
    assert_eq!((r.window_ms(), r.top_k(), r.epoch_ms()), (1000, 64, 5000));
    assert_eq!(r.pinned(), ["vote:final"]);
}

#[test]
fn first_matching_rule_wins() {
    let t = "version: 1\nrules:\n  - match: \"a:b*\"\n    write: { strategy: combine }\n  - match: \"a:*\"\n    write: { strategy: salt }\n";
    let r = Rules::parse(t, "r.yaml").unwrap();
    assert_eq!(r.resolve(b"a:bc").write.strategy, Strategy::Combine);
    assert_eq!(r.resolve(b"a:c").write.strategy, Strategy::Salt);
    assert_eq!(r.resolve(b"b").rule, None);
}

#[test]
fn partial_defaults_merge_over_builtin_and_rules_over_defaults() {
    let t = "version: 1\ndefaults:\n  write: { strategy: combine, salt: { max_shards: 16 } }\n  read: { cache: { ttl_ms: 50 } }\nrules:\n  - match: \"x\"\n    write: { salt: { per_shard_per_sec: 10 } }\n    read: { hot_at_per_sec: 900 }\n";
    let r = Rules::parse(t, "r.yaml").unwrap();
    let d = r.defaults();
    assert_eq!(
        (
            d.write.strategy,
            d.write.salt.max_shards,
            d.write.hot_at_per_sec
        ),
        (Strategy::Combine, 16, 2000.0)
    );
    assert_eq!((d.read.cache.ttl_ms, d.read.cache.jitter_pct), (50, 20));
    let x = r.resolve(b"x");
    assert_eq!(
        (
            x.write.strategy,
            x.write.salt.max_shards,
            x.write.salt.per_shard_per_sec
        ),
        (Strategy::Combine, 16, 10.0)
    );
    assert_eq!(
        (
            x.read.hot_at_per_sec,
            x.read.cool_below_per_sec,
            x.read.cache.ttl_ms
        ),
        (900.0, 500.0, 50)
    );
}

#[test]
fn min_hot_at_takes_the_lowest_threshold_anywhere() {
    let t = "version: 1\nrules:\n  - match: a\n    read: { hot_at_per_sec: 700 }\n  - match: b\n    write: { hot_at_per_sec: 900 }\n";
    let r = Rules::parse(t, "r.yaml").unwrap();
    assert_eq!(r.min_hot_at(), (700.0, 900.0));
    assert_eq!(Rules::default().min_hot_at(), (2000.0, 2000.0));
}

#[test]
fn unknown_field_is_located_with_its_path() {
    let t = "version: 1\nrules:\n  - match: a\n  - match: b\n    write: { strategyy: salt }\n";
    let e = err(t);
    assert_eq!(
        (e.file.as_str(), e.line, e.column),
        ("r.yaml", 5, 14),
        "{e}"
    );
    assert_eq!(e.field, "rules[1].write.strategyy");
    assert!(e.message.starts_with("unknown field `strategyy`"), "{e}");
    assert!(
        e.to_string()
            .starts_with("r.yaml:5:14: rules[1].write.strategyy: unknown field"),
        "{e}"
    );
}

#[test]
fn wrong_strategy_name_lists_the_right_ones() {
    let e = err("version: 1\ndefaults:\n  write:\n    strategy: salted\n");
    assert_eq!(
        (e.line, e.field.as_str()),
        (4, "defaults.write.strategy"),
        "{e}"
    );
    assert!(e.message.contains("salt+combine"), "{e}");
}

#[test]
fn semantic_errors_point_at_the_line_to_edit() {
    let cases: &[(&str, usize, &str)] = &[
        ("version: 2\n", 1, "version"),
        ("version: 1\ndetection: { window_ms: 5 }\n", 2, "detection.window_ms"),
        ("version: 1\ndetection:\n  top_k: 0\n", 3, "detection.top_k"),
        ("version: 1\ndetection:\n  top_k: 8193\n", 3, "detection.top_k"),
        ("version: 1\nepoch_ms: 100\n", 2, "epoch_ms"),
        // epoch_ms not written: the window the file does write is the one to look at.
        ("version: 1\ndetection: { window_ms: 9000 }\n", 2, "detection.window_ms"),
        ("version: 1\ndefaults:\n  read: { cache: { jitter_pct: 101 } }\n", 3, "defaults.read.cache.jitter_pct"),
        ("version: 1\ndefaults:\n  write:\n    cool_below_per_sec: 3000\n", 4, "defaults.write.cool_below_per_sec"),
        ("version: 1\ndefaults:\n  write: { salt: { max_shards: 2000 } }\n", 3, "defaults.write.salt.max_shards"),
        (
            "version: 1\nrules:\n  - match: a\n  - match: b\n    write:\n      salt: { shards: 65 }\n",
            6,
            "rules[1].write.salt.shards",
        ),
        // The rule sets only hot_at; the cool_below it inherits is above it.
        ("version: 1\nrules:\n  - match: a\n    read:\n      hot_at_per_sec: 100\n", 5, "rules[0].read.hot_at_per_sec"),
        ("version: 1\nrules:\n  - match: ok\n  - match: \"bad[\"\n", 4, "rules[1].match"),
        ("version: 1\nrules:\n  - match: \"*\"\n  - match: b\n", 4, "rules[1].match"),
        ("version: 1\nrules:\n  - { match: a }\n  - { match: a }\n", 4, "rules[1].match"),
        ("version: 1\nrules:\n  - match: a\n    write: { combine: { window_us: 0 } }\n", 4, "rules[0].write.combine.window_us"),
        ("version: 1\nrules:\n  - match: a\n    write: { salt: { per_shard_per_sec: .nan } }\n", 4, "rules[0].write.salt.per_shard_per_sec"),
        // Lists have no exact merge: a rule may not let the proxy salt them.
        ("version: 1\nrules:\n  - match: q\n  - match: a\n    write:\n      salt: { families: [counters, lists] }\n", 6, "rules[1].write.salt.families"),
        ("version: 1\ndefaults:\n  write:\n    salt:\n      families: [queues]\n", 5, "defaults.write.salt.families"),
    ];
    for (text, line, field) in cases {
        let e = err(text);
        assert_eq!(
            (e.line, e.field.as_str()),
            (*line, *field),
            "{text}\n-> {e}"
        );
        assert_eq!(e.file, "r.yaml");
    }
}

#[test]
fn parse_errors_without_a_position_get_one() {
    let e = err("version: 1\nrules:\n  - match: a\n    pin: true\n    pin: false\n");
    assert_eq!(
        (e.line, e.column, e.field.as_str()),
        (5, 5, "rules[0].pin"),
        "{e}"
    );
    let e = err("rules: []\n");
    assert_eq!(e.field, "version", "{e}");
    let e = err("version: 1\nrules:\n  - pin: true\n");
    assert!(
        e.field.starts_with("rules[0]") && e.field.ends_with("match"),
        "{e}"
    );
    assert_eq!(e.line, 3, "{e}");
}

#[test]
fn wrong_types_are_located() {
    let e = err("- a\n");
    assert_eq!(
        e.message,
        "invalid type: sequence, expected a mapping of `field: value`"
    );
    let e = err("version: 1\nrules:\n  - match: a\n    write: { salt: { shards: lots } }\n");
    assert_eq!(
        (e.line, e.field.as_str()),
        (4, "rules[0].write.salt.shards"),
        "{e}"
    );
    let e = err("version: 1\nrules:\n  - match: a\n    pin: maybe\n");
    assert_eq!((e.line, e.field.as_str()), (4, "rules[0].pin"), "{e}");
}

#[test]
fn json_shows_effective_rules_and_parses_back_to_the_same() {
    let r = Rules::parse(ISSUE, "r.yaml").unwrap();
    let json = r.to_json();
    assert!(
        json.contains("\"match\": \"likes:*\"") && json.contains("\"strategy\": \"salt\""),
        "{json}"
    );
    assert!(
        json.contains("\"shards\": 8") && json.contains("\"shards\": \"auto\""),
        "{json}"
    );
    assert_eq!(Rules::parse(&json, "served.json").unwrap(), r);
}

#[test]
fn load_names_the_file_it_cannot_read() {
    let e = Rules::load(Path::new("no-such-dir/rules.yaml")).unwrap_err();
    assert_eq!(e.file, "no-such-dir/rules.yaml");
    assert!(e.message.starts_with("cannot read"), "{e}");
}

#[test]
fn admit_sections_are_checked_with_their_place() {
    let ok = Rules::parse(include_str!("../../rules/examples/admission.yaml"), "a").unwrap();
    let (i, a) = ok.admit(b"api:quota:1").unwrap();
    assert_eq!(i, 0);
    assert_eq!(a.burst, Some(200.0));
    // A rule without burst shows the one in force.
    assert_eq!(ok.admit(b"suggest:x").unwrap().1.burst, Some(50.0));
    assert!(ok.any_admit());
    assert!(ok.to_json().contains("\"admit\""));
    assert!(!Rules::default().any_admit());
    for (text, field, what) in [
        (
            "rules:\n  - match: \"a\"\n    admit: { limit_per_sec: 0 }\n",
            "rules[0].admit.limit_per_sec",
            "positive",
        ),
        (
            "rules:\n  - match: \"a\"\n    admit: { scope: global }\n",
            "rules[0].admit.scope",
            "needs limit_per_sec",
        ),
        (
            "rules:\n  - match: \"a\"\n    admit: { over_limit: delay }\n",
            "rules[0].admit.over_limit",
            "needs limit_per_sec",
        ),
        (
            "rules:\n  - match: \"a\"\n    admit: { burst: 5 }\n",
            "rules[0].admit.burst",
            "needs limit_per_sec",
        ),
        (
            "rules:\n  - match: \"a\"\n    admit: { limit_per_sec: 5, sample_one_in: 1 }\n",
            "rules[0].admit.sample_one_in",
            "out of range",
        ),
        (
            "rules:\n  - match: \"a\"\n    admit: { limit_per_sec: 5, over_limit: drop }\n",
            "rules[0].admit.over_limit",
            "unknown variant",
        ),
        (
            "admission: { shed_low_at_pending: 10, shed_normal_at_pending: 5 }\n",
            "admission.shed_normal_at_pending",
            "out of range",
        ),
    ] {
        let e = err(&format!("version: 1\n{text}"));
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(what), "{e}");
        assert!(e.line >= 2, "{e}");
    }
}

#[test]
fn cost_floors_are_the_lowest_ratio_of_cost_to_read_rate() {
    let d = Rules::default().cost_floors();
    assert_eq!((d.bytes, d.node_us), (8388, 50));
    let t = "version: 1\nrules:\n  - match: big:*\n    read: { hot_at_bytes_per_sec: 1048576, cool_below_bytes_per_sec: 1000 }\n";
    let r = Rules::parse(t, "r.yaml").unwrap();
    assert_eq!(r.cost_floors().bytes, 524);
    assert_eq!(r.cost_floors().node_us, 50);
}
