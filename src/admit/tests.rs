//! Admission decisions, one key at a time, on the real clock (the figures are counts, not
//! rates, so they do not depend on how fast the machine is).

use super::*;

fn rules(text: &str) -> Arc<Rules> {
    Arc::new(Rules::parse(text, "r.yaml").unwrap_or_else(|e| panic!("{e}")))
}

fn idle() -> NodeLoad<'static> {
    NodeLoad {
        addr: "n:1",
        pending: 0,
    }
}

fn adm() -> Admission {
    Admission::new(AdmissionMetrics::default())
}

fn run(a: &Admission, r: &Arc<Rules>, key: &[u8], incr: Option<i64>, n: usize) -> Vec<Verdict> {
    let (i, s) = r.admit(key).expect("a rule with admit");
    (0..n)
        .map(|_| a.check(r, i, s, key, incr, idle()))
        .collect()
}

#[test]
fn a_key_gets_its_burst_then_a_named_refusal_and_keys_are_apart() {
    let r = rules(
        "version: 1\nrules:\n  - match: \"q:*\"\n    admit: { limit_per_sec: 1, burst: 5 }\n",
    );
    let a = adm();
    let v = run(&a, &r, b"q:1", None, 8);
    assert_eq!(v.iter().filter(|v| **v == Verdict::Admit).count(), 5);
    match &v[7] {
        Verdict::Reject(m) => {
            assert!(m.starts_with("THROTTLED "), "{m}");
            assert!(m.contains("q:*") && m.contains("1/s"), "{m}");
        }
        v => panic!("{v:?}"),
    }
    // Another key has its own bucket; a key no admit rule matches is not asked about.
    assert_eq!(run(&a, &r, b"q:2", None, 1), vec![Verdict::Admit]);
    assert!(r.admit(b"other").is_none());
    assert_eq!(a.marked(b"q:1"), Some(Marked::Limited));
    assert_eq!(a.marked(b"q:2"), None);
}

#[test]
fn sampling_sends_one_in_n_scaled_and_answers_the_rest_with_the_last_value() {
    let r = rules("version: 1\nrules:\n  - match: \"v:*\"\n    admit: { limit_per_sec: 1, burst: 2, over_limit: sample, sample_one_in: 4 }\n");
    let a = adm();
    // Under the limit: sent, and their replies remembered.
    assert_eq!(run(&a, &r, b"v:1", Some(1), 2), vec![Verdict::Record; 2]);
    // Over it, before any reply was seen: sent as they are.
    assert_eq!(run(&a, &r, b"v:1", Some(1), 1), vec![Verdict::Record]);
    a.record(b"v:1", 3);
    let v = run(&a, &r, b"v:1", Some(1), 8);
    assert_eq!(
        v,
        vec![
            Verdict::Answer(3),
            Verdict::Answer(3),
            Verdict::Answer(3),
            Verdict::Scaled(4),
            Verdict::Answer(3),
            Verdict::Answer(3),
            Verdict::Answer(3),
            Verdict::Scaled(4),
        ]
    );
    assert_eq!(a.marked(b"v:1"), Some(Marked::Sampled));
    // Not a counter: refused.
    assert!(matches!(
        run(&a, &r, b"v:1", None, 1)[0],
        Verdict::Reject(_)
    ));
}

#[test]
fn delay_waits_for_the_next_token_up_to_its_bound() {
    let r = rules("version: 1\nrules:\n  - match: \"d:*\"\n    admit: { limit_per_sec: 10, burst: 1, over_limit: delay, max_delay_ms: 250 }\n");
    let a = adm();
    let v = run(&a, &r, b"d:1", None, 3);
    assert_eq!(v[0], Verdict::Admit);
    let waits: Vec<u128> = v[1..]
        .iter()
        .map(|v| match v {
            Verdict::Delay(d) => d.as_millis(),
            v => panic!("{v:?}"),
        })
        .collect();
    // About 100 ms and 200 ms (less the time the test took), then past the bound.
    assert!(
        (90..=100).contains(&waits[0]) && (190..=200).contains(&waits[1]),
        "{waits:?}"
    );
    assert!(matches!(
        run(&a, &r, b"d:1", None, 1)[0],
        Verdict::Reject(_)
    ));
}

#[test]
fn an_overloaded_node_sheds_low_priority_first_and_never_high() {
    let r = rules(
        "version: 1\nadmission: { shed_low_at_pending: 100, shed_normal_at_pending: 1000 }\nrules:\n  - match: \"low:*\"\n    admit: { priority: low }\n  - match: \"norm:*\"\n    admit: { over_limit: sample }\n  - match: \"high:*\"\n    admit: { priority: high, limit_per_sec: 1000000 }\n",
    );
    let a = adm();
    let at = |pending| NodeLoad {
        addr: "n:1",
        pending,
    };
    let ask = |key: &[u8], incr, pending| {
        let (i, s) = r.admit(key).unwrap();
        a.check(&r, i, s, key, incr, at(pending))
    };
    assert_eq!(ask(b"low:1", None, 99), Verdict::Admit);
    match ask(b"low:1", None, 100) {
        Verdict::Reject(m) => assert!(m.contains("overloaded") && m.contains("n:1"), "{m}"),
        v => panic!("{v:?}"),
    }
    assert_eq!(ask(b"norm:1", Some(1), 500), Verdict::Record);
    a.record(b"norm:1", 7);
    assert_eq!(ask(b"norm:1", Some(1), 1000), Verdict::Answer(7));
    assert_eq!(ask(b"high:1", None, 1_000_000), Verdict::Admit);
}

#[test]
fn memory_is_bounded_and_idle_keys_go_first() {
    let r = rules("version: 1\nrules:\n  - match: \"*\"\n    admit: { limit_per_sec: 1000000, burst: 1000000 }\n");
    let a = adm();
    let (i, s) = r.admit(b"k").unwrap();
    for n in 0..(MAX_KEYS * 2) {
        let key = format!("k:{n}");
        assert_eq!(
            a.check(&r, i, s, key.as_bytes(), None, idle()),
            Verdict::Admit
        );
    }
    let held: usize = a.shards.iter().map(|m| m.lock().unwrap().len()).sum();
    assert!(held <= MAX_KEYS, "{held}");
    assert_eq!(a.metrics.keys.get() as usize, held);
}

#[test]
fn a_proxy_new_to_a_global_limit_starts_at_its_start_share() {
    let r = rules("version: 1\nrules:\n  - match: \"g:*\"\n    admit: { limit_per_sec: 1000, burst: 1000, scope: global, start_share_pct: 5 }\n");
    let a = adm();
    // 5% of the burst, then nothing more until a sync gives it a share.
    let n = run(&a, &r, b"g:1", None, 200)
        .iter()
        .filter(|v| **v == Verdict::Admit)
        .count();
    assert!((50..=51).contains(&n), "{n}");
}

#[test]
fn a_byte_limit_refuses_a_key_that_moved_more_until_it_is_back_under() {
    let r = rules(
        "version: 1\nrules:\n  - match: \"page:*\"\n    admit: { limit_bytes_per_sec: 1000000 }\n",
    );
    let a = adm();
    let (i, s) = r.admit(b"page:1").expect("rule");
    // A second's worth may go at once: two replies of 600 KB, then the key is in debt.
    assert_eq!(a.check(&r, i, s, b"page:1", None, idle()), Verdict::Admit);
    a.charge(b"page:1", s, 600_000);
    assert_eq!(a.check(&r, i, s, b"page:1", None, idle()), Verdict::Admit);
    a.charge(b"page:1", s, 600_000);
    match a.check(&r, i, s, b"page:1", None, idle()) {
        Verdict::Reject(m) => assert!(m.contains("1000000 bytes/s") && m.contains("page:*"), "{m}"),
        v => panic!("{v:?}"),
    }
    assert_eq!(a.marked(b"page:1"), Some(Marked::Limited));
    // Another key has its own bytes; the debt (200 KB) is paid back in about 0.2 s.
    assert_eq!(a.check(&r, i, s, b"page:2", None, idle()), Verdict::Admit);
    std::thread::sleep(std::time::Duration::from_millis(260));
    assert_eq!(a.check(&r, i, s, b"page:1", None, idle()), Verdict::Admit);
}

#[test]
fn a_byte_limit_is_checked_like_every_field() {
    let bad = Rules::parse(
        "version: 1\nrules:\n  - match: \"p\"\n    admit: { limit_bytes_per_sec: 10 }\n",
        "r.yaml",
    )
    .expect_err("10 bytes/s is below 1024");
    assert!(
        bad.to_string()
            .contains("rules[0].admit.limit_bytes_per_sec"),
        "{bad}"
    );
}
