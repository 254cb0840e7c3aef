//! The decide phase: what to do with one classified command, given the rules and which
//! keys are hot now. Pure, no I/O, so a table test covers every case.
//!
//! The data path reads a `HotSet` snapshot (rebuilt by `HotSet::build` when the detector
//! publishes or the rules reload); when nothing is hot and nothing is pinned, `decide`
//! costs one branch.

use std::time::Duration;

use crate::command::{flags, Args, Classified, Cmd, Counter};
pub use salted::{SaltPlan, SaltView};

mod hot;
mod salted;
use crate::rules::CachePolicy;
pub use hot::{
    fill_share, per_batch_now, FillShare, HotSet, Ledger, WriteHot, DECLINE_FILL_SHARE,
    DECLINE_PER_COMMAND, HOLD_COMBINE_DECLINE, HOLD_MEASURED_DECLINE, MIN_BATCHES_TO_JUDGE,
    MIN_FILLS_TO_JUDGE, READMIT_FILL_SHARE, RECOMBINE_PER_COMMAND,
};

/// What to do with one command.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Route as the command table says.
    Forward,
    /// Add `delta` to the key's (and field's) combine batch.
    Combine {
        delta: i64,
        field: Option<usize>,
        window: Duration,
    },
    /// Serve from the proxy cache (single-flight fill on a miss).
    Cache(CachePolicy),
    /// MGET with read-hot keys: the policy of each key in order, `None` for a cold one.
    /// Hot keys are served from the cache like a `GET` of the key, cold ones by their node.
    CachePerKey(Vec<Option<CachePolicy>>),
    /// The command names a salted key: served as the plan says (`salted`). `then`: what
    /// it does when the plan goes on as usual (a fold first, or a write the base key
    /// takes), decided here with the plan so that the session never decides again: an
    /// increment of a key whose promotion is not in force yet is combined (`bridge`), any
    /// other command is treated as any command on its key (`decide_plain`), and inside
    /// MULTI it is forwarded. Boxed: the plan is large and rare, and every command's
    /// action is moved through the act phase.
    Salted(Box<Salted>),
    /// `SALTSHAKER.INCRBY key delta id`: applied once per ID by a task (`salt::idem`),
    /// on the key's shard if it is salted.
    Idempotent { delta: i64 },
}

/// A salted command's plan, and what the command does when the plan goes on as usual.
#[derive(Clone, Debug, PartialEq)]
pub struct Salted {
    pub plan: SaltPlan,
    pub then: Action,
}

/// Read commands whose replies may be cached for a read-hot key: single-key reads whose
/// reply depends only on the key's value and the arguments.
const CACHEABLE: &[Cmd] = &[
    Cmd::Get,
    Cmd::Getrange,
    Cmd::Strlen,
    Cmd::Hget,
    Cmd::Hmget,
    Cmd::Hgetall,
    Cmd::Hexists,
    Cmd::Hlen,
    Cmd::Hkeys,
    Cmd::Hvals,
    Cmd::Hstrlen,
    Cmd::Smembers,
    Cmd::Sismember,
    Cmd::Smismember,
    Cmd::Scard,
    Cmd::Zrange,
    Cmd::Zrevrange,
    Cmd::Zrangebyscore,
    Cmd::Zrevrangebyscore,
    Cmd::Zrangebylex,
    Cmd::Zrevrangebylex,
    Cmd::Zscore,
    Cmd::Zmscore,
    Cmd::Zcard,
    Cmd::Zcount,
    Cmd::Zrank,
    Cmd::Zrevrank,
    Cmd::Lrange,
    Cmd::Llen,
    Cmd::Lindex,
    Cmd::Exists,
    Cmd::Type,
];

/// Decides what to do with a command: its salted plan if it names a salted key, else what
/// the hot set says (outside MULTI).
pub fn decide<A: Args + ?Sized>(
    c: &Classified,
    args: &A,
    hot: &HotSet,
    salted: &SaltView,
) -> Action {
    if c.spec.cmd == Cmd::SaltshakerIncrby {
        return idempotent(args, salted);
    }
    if let Some(plan) = salted::plan(salted, args, c) {
        let then = match bridge(c, &plan) {
            _ if salted.in_tx => Action::Forward,
            Some(combine) => combine,
            None => decide_plain(c, args, hot),
        };
        return Action::Salted(Box::new(Salted { plan, then }));
    }
    if salted.in_tx {
        return Action::Forward;
    }
    decide_plain(c, args, hot)
}

/// `SALTSHAKER.INCRBY key delta id` (arity checked by the table).
fn idempotent<A: Args + ?Sized>(args: &A, v: &SaltView) -> Action {
    let reject = |m| {
        Action::Salted(Box::new(Salted {
            plan: SaltPlan::Reject(m),
            then: Action::Forward,
        }))
    };
    if v.in_tx {
        return reject("ERR saltshaker: SALTSHAKER.INCRBY cannot run inside MULTI");
    }
    let Some(delta) = crate::resp::parse_i64(args.arg(2)) else {
        return reject("ERR value is not an integer or out of range");
    };
    let id = args.arg(3);
    if id.is_empty() || id.len() > crate::salt::idem::MAX_ID_BYTES {
        return reject("ERR saltshaker: an increment ID is 1 to 256 bytes");
    }
    Action::Idempotent { delta }
}

/// Decides what to do with a command that names no salted key (or goes on as usual after
/// its salted plan): combine, cache, or forward.
pub fn decide_plain<A: Args + ?Sized>(c: &Classified, args: &A, hot: &HotSet) -> Action {
    if hot.is_empty() {
        return Action::Forward;
    }
    if c.spec.cmd == Cmd::Mget {
        return cache_per_key(c, args, hot);
    }
    if c.keys.len() != 1 {
        return Action::Forward;
    }
    if c.spec.flags & flags::WRITE == 0 {
        if CACHEABLE.contains(&c.spec.cmd) {
            if let Some(p) = hot.read_hot(args.arg(c.keys[0] as usize)) {
                return Action::Cache(p);
            }
        }
        return Action::Forward;
    }
    if c.spec.flags & flags::COUNTER == 0 {
        return Action::Forward;
    }
    let Some(h) = hot.write_hot(args.arg(c.keys[0] as usize)) else {
        return Action::Forward;
    };
    // INCRBYFLOAT/HINCRBYFLOAT have no typed counter: Redis formats the float result
    // itself, and we could not give each caller its exact reply, so they are forwarded.
    match c.counter {
        Some(Counter {
            delta: Ok(delta),
            field,
        }) => Action::Combine {
            delta,
            field: field.map(|f| f as usize),
            window: h.combine_window,
        },
        // Not a valid integer: let the node give its own error.
        _ => Action::Forward,
    }
}

/// The bridge from detection to salting: an increment of a salted key whose promotion is
/// announced but not yet in force (`SaltPlan::Base` with its rule's window) is combined
/// into the base key, on every proxy that knows of the promotion, whether or not it saw
/// the key hot itself. Combining keeps every reply exact, and the base key is what every
/// reader merges, so nothing changes for readers.
fn bridge(c: &Classified, plan: &SaltPlan) -> Option<Action> {
    let SaltPlan::Base(_, Some(window)) = plan else {
        return None;
    };
    match c.counter {
        Some(Counter {
            delta: Ok(delta),
            field,
        }) if c.spec.flags & flags::COUNTER != 0 && c.keys.len() == 1 => Some(Action::Combine {
            delta,
            field: field.map(|f| f as usize),
            window: *window,
        }),
        _ => None,
    }
}

/// An MGET is cached per key when at least one of its keys is read-hot.
fn cache_per_key<A: Args + ?Sized>(c: &Classified, args: &A, hot: &HotSet) -> Action {
    if !hot.may_cache() {
        return Action::Forward;
    }
    let per_key: Vec<Option<CachePolicy>> = c
        .keys
        .iter()
        .map(|&k| hot.read_hot(args.arg(k as usize)))
        .collect();
    if per_key.iter().all(Option::is_none) {
        return Action::Forward;
    }
    Action::CachePerKey(per_key)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::command::classify;
    use crate::hotkey::{HotKey, HotSnapshot, HotState};
    use crate::rules::Rules;

    fn snap(keys: &[&str]) -> HotSnapshot {
        HotSnapshot {
            window_ms: 1000,
            keys: keys
                .iter()
                .map(|k| HotKey {
                    key: k.as_bytes().to_vec(),
                    reads_per_sec: 0.0,
                    writes_per_sec: 50_000.0,
                    share: 0.5,
                    state: HotState::Hot,
                    since_unix_ms: 0,
                    read_state: None,
                    write_state: Some(HotState::Hot),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn read_hot(key: &str, reads: f64, writes: f64) -> HotSnapshot {
        HotSnapshot {
            window_ms: 1000,
            keys: vec![HotKey {
                key: key.as_bytes().to_vec(),
                reads_per_sec: reads,
                writes_per_sec: writes,
                state: HotState::Hot,
                read_state: Some(HotState::Hot),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn write_hot_snap(key: &str, writes: f64) -> HotSnapshot {
        HotSnapshot {
            window_ms: 1000,
            keys: vec![HotKey {
                key: key.as_bytes().to_vec(),
                writes_per_sec: writes,
                state: HotState::Hot,
                write_state: Some(HotState::Hot),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn combining_a_trickle_is_declined_and_a_crowd_is_combined_with_hysteresis() {
        // The default rules: combine window 500 µs.
        let rules = Arc::new(Rules::default());
        let none = HashMap::new();
        // `per` increments per command over 20 batches.
        let measured = |per: f64| -> HashMap<Bytes, Ledger> {
            let l = Ledger {
                increments: (per * 20.0) as u64,
                combine_commands: 20,
                ..Default::default()
            };
            [(Bytes::from_static(b"k"), l)].into()
        };
        let combined = |h: &HotSet| h.write_hot(b"k").is_some();
        let build = |writes: f64, prev: Option<&HotSet>, batched: &HashMap<Bytes, Ledger>| {
            HotSet::build_after(&write_hot_snap("k", writes), rules.clone(), prev, batched)
        };
        // Newly hot, nothing measured: combined, to be measured.
        let a = build(1_000.0, None, &none);
        assert!(combined(&a) && a.not_combined(b"k").is_none());
        // Its batches carried 1.2 increments per command: declined.
        let b = build(1_000.0, Some(&a), &measured(1.2));
        assert!(!combined(&b));
        assert_eq!(b.not_combined(b"k"), Some(1.2));
        assert_eq!(b.combine_changes(&a).0.len(), 1);
        // Declined at 1,000/s; at 1,500/s its batches would carry 1.3: not taken again
        // under 2.5.
        let c = build(1_500.0, Some(&b), &none);
        assert!(!combined(&c));
        let per = c.not_combined(b"k").unwrap();
        assert!((per - 1.3).abs() < 1e-9, "{per}");
        // At 8,500/s they would carry 2.7: combined again, to be measured anew.
        let d = build(8_500.0, Some(&c), &none);
        assert!(combined(&d));
        assert_eq!(d.combine_changes(&c).1.len(), 1);
        // One client writing fast fills no batch at any rate: measured 1.0, declined
        // again, and held so for HOLD_COMBINE_DECLINE windows whatever its rate, then
        // tried again.
        let mut h = build(8_500.0, Some(&d), &measured(1.0));
        for _ in 0..=HOLD_COMBINE_DECLINE {
            assert!(!combined(&h));
            h = build(20_000.0, Some(&h), &none);
        }
        assert!(combined(&h));
        // Combined, batches of 2.0 keep it combined: the line to drop it is 2.0.
        let e = build(8_500.0, Some(&d), &measured(2.0));
        assert!(combined(&e));
    }

    #[test]
    fn a_cache_that_writes_would_keep_refilling_is_declined_then_taken_again_with_hysteresis() {
        let rules = Arc::new(Rules::default());
        let cached = |h: &HotSet| h.read_hot(b"k").is_some();
        let a = HotSet::build(&read_hot("k", 10_000.0, 1_000.0), rules.clone());
        assert!(cached(&a) && a.not_cached(b"k").is_none());
        // Writes make 40% of the reads fills: declined.
        let b = HotSet::build_after(
            &read_hot("k", 10_000.0, 4_000.0),
            rules.clone(),
            Some(&a),
            &HashMap::new(),
        );
        assert!(!cached(&b));
        assert_eq!(
            b.not_cached(b"k"),
            Some(FillShare {
                share: 0.4,
                measured: false,
                held: 0
            })
        );
        assert_eq!(b.cache_changes(&a).0.len(), 1);
        // 30%: under the line to decline, over the line to take it again.
        let c = HotSet::build_after(
            &read_hot("k", 10_000.0, 3_000.0),
            rules.clone(),
            Some(&b),
            &HashMap::new(),
        );
        assert!(!cached(&c));
        assert!(HotSet::build_after(
            &read_hot("k", 10_000.0, 3_000.0),
            rules.clone(),
            Some(&a),
            &HashMap::new()
        )
        .read_hot(b"k")
        .is_some());
        // 20%: cached again.
        let d = HotSet::build_after(
            &read_hot("k", 10_000.0, 2_000.0),
            rules,
            Some(&c),
            &HashMap::new(),
        );
        assert!(cached(&d));
        assert_eq!(d.cache_changes(&c).1.len(), 1);
    }

    #[test]
    fn a_cache_whose_fills_were_a_third_of_its_reads_is_declined_on_the_measure() {
        let rules = Arc::new(Rules::default());
        let cached = |h: &HotSet| h.read_hot(b"k").is_some();
        let ledger = |hits: u64, fills: u64| -> HashMap<Bytes, Ledger> {
            let l = Ledger {
                cache_hits: hits,
                cache_fills: fills,
                ..Default::default()
            };
            [(Bytes::from_static(b"k"), l)].into()
        };
        // Its rates say 10% of reads would be fills: cached.
        let a = HotSet::build(&read_hot("k", 10_000.0, 1_000.0), rules.clone());
        assert!(cached(&a));
        // Measured, fills were 40% of its reads (its writes come from elsewhere, unseen
        // by this proxy's detector): declined, and the reason says it was measured.
        let snap = read_hot("k", 10_000.0, 1_000.0);
        let b = HotSet::build_after(&snap, rules.clone(), Some(&a), &ledger(600, 400));
        assert!(!cached(&b));
        assert_eq!(
            b.not_cached(b"k"),
            Some(FillShare {
                share: 0.4,
                measured: true,
                held: 0
            })
        );
        assert_eq!(b.ledger(b"k").map(|l| l.cache_fills), Some(400));
        // Held declined for HOLD_MEASURED_DECLINE windows though its rates say it would
        // pay, then tried again.
        let mut h = b;
        for _ in 0..HOLD_MEASURED_DECLINE {
            h = HotSet::build_after(&snap, rules.clone(), Some(&h), &HashMap::new());
            assert!(!cached(&h));
        }
        let again = HotSet::build_after(&snap, rules.clone(), Some(&h), &HashMap::new());
        assert!(cached(&again));
        // Too few fills to judge by: the rates decide (cached).
        let c = HotSet::build_after(&snap, rules.clone(), Some(&a), &ledger(5, 10));
        assert!(cached(&c));
        // Hits three times its fills: it pays, cached.
        let d = HotSet::build_after(&snap, rules, Some(&a), &ledger(3_000, 1_000));
        assert!(cached(&d) && d.not_cached(b"k").is_none());
    }

    fn act(line: &str, hot: &HotSet) -> Action {
        let args: Vec<&[u8]> = line.split(' ').map(|s| s.as_bytes()).collect();
        let c = classify(&args[..]).unwrap();
        decide_plain(&c, &args[..], hot)
    }

    const RULES: &str = "version: 1\nrules:\n  - match: \"lock:*\"\n    write: { strategy: off }\n  - match: \"vote:final\"\n    pin: true\n    write: { strategy: combine, combine: { window_us: 200 } }\n";

    #[test]
    fn nothing_hot_forwards_everything() {
        let hot = HotSet::default();
        assert_eq!(act("INCR likes:1", &hot), Action::Forward);
    }

    #[test]
    fn hot_counter_increments_are_combined_with_their_delta() {
        let rules = Arc::new(Rules::default());
        let hot = HotSet::build(&snap(&["likes:1"]), rules);
        let w = Duration::from_micros(500);
        assert_eq!(
            act("INCR likes:1", &hot),
            Action::Combine {
                delta: 1,
                field: None,
                window: w
            }
        );
        assert_eq!(
            act("DECRBY likes:1 5", &hot),
            Action::Combine {
                delta: -5,
                field: None,
                window: w
            }
        );
        assert_eq!(
            act("HINCRBY likes:1 f 7", &hot),
            Action::Combine {
                delta: 7,
                field: Some(2),
                window: w
            }
        );
        assert_eq!(act("INCR likes:2", &hot), Action::Forward);
        assert_eq!(act("GET likes:1", &hot), Action::Forward);
        assert_eq!(act("INCRBYFLOAT likes:1 1.5", &hot), Action::Forward);
    }

    #[test]
    fn invalid_increments_are_left_to_the_node() {
        let hot = HotSet::build(&snap(&["k"]), Arc::new(Rules::default()));
        assert_eq!(act("INCRBY k 01", &hot), Action::Forward);
        assert_eq!(act("INCRBY k x", &hot), Action::Forward);
        assert_eq!(act("DECRBY k -9223372036854775808", &hot), Action::Forward);
    }

    #[test]
    fn reads_of_a_read_hot_key_are_cached_writes_are_not() {
        let mut s = snap(&[]);
        s.keys.push(HotKey {
            key: b"profile:1".to_vec(),
            reads_per_sec: 90_000.0,
            writes_per_sec: 0.0,
            share: 0.9,
            state: HotState::Hot,
            since_unix_ms: 0,
            read_state: Some(HotState::Hot),
            write_state: None,
            ..Default::default()
        });
        let hot = HotSet::build(&s, Arc::new(Rules::default()));
        assert!(matches!(act("GET profile:1", &hot), Action::Cache(_)));
        assert!(matches!(act("HGETALL profile:1", &hot), Action::Cache(_)));
        assert_eq!(act("SET profile:1 x", &hot), Action::Forward);
        assert_eq!(act("GET profile:2", &hot), Action::Forward);
        assert_eq!(act("GETDEL profile:1", &hot), Action::Forward);
        let Action::CachePerKey(per_key) = act("MGET a profile:1 b profile:1", &hot) else {
            panic!("MGET with a read-hot key is cached per key");
        };
        let hot_keys: Vec<bool> = per_key.iter().map(Option::is_some).collect();
        assert_eq!(hot_keys, [false, true, false, true]);
        assert_eq!(act("MGET a b", &hot), Action::Forward);
        assert_eq!(act("MSET profile:1 x a y", &hot), Action::Forward);
    }

    #[test]
    fn strategy_off_is_never_combined_and_pins_are_hot_from_the_start() {
        let rules = Arc::new(Rules::parse(RULES, "r.yaml").unwrap());
        let hot = HotSet::build(&snap(&["lock:1"]), rules);
        assert_eq!(act("INCR lock:1", &hot), Action::Forward);
        let w = Duration::from_micros(200);
        assert_eq!(
            act("INCR vote:final", &hot),
            Action::Combine {
                delta: 1,
                field: None,
                window: w
            }
        );
    }
}
