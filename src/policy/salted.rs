//! The decide phase for a command that names a salted key: how it is served (`SaltPlan`).
//! Pure like the rest of `policy`: it reads the salt table snapshot and a few facts about
//! the session and the registry (`SaltView`), sends nothing and counts nothing (the act
//! phase, `proxy::act::salted`, counts what it does).

use std::sync::Arc;

use bytes::Bytes;

use std::time::Duration;

use crate::command::{Args, Classified, Cmd};
use crate::rules::{ReadTier, Rules, Strategy};
use crate::salt::kind::{is_write, needs_quiet, prepare, written, MOp, Op};
use crate::salt::{kinds, merge, ops, SaltTable, Salted};

/// What the salted plan needs to know besides the command.
pub struct SaltView<'a> {
    pub table: &'a Arc<SaltTable>,
    /// The session's database: the registry speaks of database 0's keys only.
    pub db: u32,
    /// Inside MULTI: every salted key is folded first, the command is queued as usual.
    pub in_tx: bool,
    pub now_ms: u64,
    /// The registry was read within the last epoch: writers may use the shards.
    pub fresh: bool,
    /// The registry view is older than two ticks: a fold might be starting unseen.
    pub stale: bool,
    /// The rules: a salted key's is resolved once, when its command is decided.
    pub rules: &'a Rules,
}

impl SaltView<'_> {
    /// A fold may be moving values of `e`: reads must count values in transit.
    pub fn careful(&self, e: &Salted) -> bool {
        e.rec.fold.is_some() || e.rec.demote_ms.is_some() || self.stale
    }
}

/// How a command that names a salted key is served.
#[derive(Clone, Debug)]
pub enum SaltPlan {
    /// In this round, like any command: the part commands join the round's node jobs and a
    /// merge slot puts the replies together (reads, key commands, plain shard writes).
    Inline(Arc<Salted>, Op),
    /// A summing read while a fold may move values: base key first, then the shards
    /// (`merge::careful_read`), by a task.
    Careful(Arc<Salted>, Op),
    /// Through the shard's combine batch (salt+combine), ordered like any combined write,
    /// with the rule's combine window.
    Combine(Arc<Salted>, Op, Duration),
    /// By a task: whole reads of a partitioned kind, and its point reads while a fold may
    /// move members (`SaltKind::read`); the flag says whether one may.
    Members(Arc<Salted>, MOp, bool),
    /// By a task: a removal from a set, sorted set or hash, once no fold or spread moves
    /// its members (`ops::quiet`).
    Quiet(Arc<Salted>, MOp),
    /// By a task: multi-key commands over salted keys.
    Task(Arc<SaltTable>),
    /// Fold the shards into the base key first, then go on as usual.
    Fold(Arc<SaltTable>),
    /// A counter read of the display tier: from the key's rollup, refreshed by one merge
    /// per period (ms) (`salt::rollup`).
    Display(Arc<Salted>, Op, u64),
    /// Refused with Redis's own error before anything is sent.
    Reject(&'static str),
    /// A counter write whose whole is not known to stay clear of i64's bounds: by a task
    /// that reads the whole first (`ops::checked_write`).
    Checked(Arc<Salted>, Op),
    /// A write the base key takes, as if the key were not salted (the promotion is not in
    /// force yet, the key is demoted, or the registry was not read for too long); reads
    /// merge it. With the rule's combine window while the promotion is announced and not
    /// yet in force: an increment is then combined (`policy::bridge`).
    Base(Arc<Salted>, Option<Duration>),
}

impl PartialEq for SaltPlan {
    /// Plans are equal when they name the same entry or table (by identity) and the same
    /// operation.
    fn eq(&self, other: &Self) -> bool {
        use SaltPlan::*;
        match (self, other) {
            (Inline(a, x), Inline(b, y))
            | (Careful(a, x), Careful(b, y))
            | (Checked(a, x), Checked(b, y)) => Arc::ptr_eq(a, b) && x == y,
            (Combine(a, x, v), Combine(b, y, w)) => Arc::ptr_eq(a, b) && x == y && v == w,
            (Members(a, x, f), Members(b, y, g)) => Arc::ptr_eq(a, b) && x == y && f == g,
            (Quiet(a, x), Quiet(b, y)) => Arc::ptr_eq(a, b) && x == y,
            (Task(a), Task(b)) | (Fold(a), Fold(b)) => Arc::ptr_eq(a, b),
            (Display(a, x, m), Display(b, y, n)) => Arc::ptr_eq(a, b) && x == y && m == n,
            (Reject(a), Reject(b)) => a == b,
            (Base(a, x), Base(b, y)) => Arc::ptr_eq(a, b) && x == y,
            _ => false,
        }
    }
}

impl SaltPlan {
    /// Tasks and folds run outside the round, so the round built so far must go first.
    pub fn needs_flush(&self) -> bool {
        matches!(
            self,
            SaltPlan::Task(_)
                | SaltPlan::Fold(_)
                | SaltPlan::Careful(..)
                | SaltPlan::Checked(..)
                | SaltPlan::Members(..)
                | SaltPlan::Quiet(..)
        )
    }
}

/// The plan for a command that names a salted key; None for any other command.
pub fn plan<A: Args + ?Sized>(v: &SaltView, args: &A, c: &Classified) -> Option<SaltPlan> {
    if v.db != 0 || c.keys.is_empty() || v.table.is_empty() {
        return None;
    }
    if !c
        .keys
        .iter()
        .any(|&k| v.table.get(args.arg(k as usize)).is_some())
    {
        return None;
    }
    let table = v.table.clone();
    if v.in_tx {
        return Some(SaltPlan::Fold(table));
    }
    if c.keys.len() > 1 {
        return Some(match c.spec.cmd {
            Cmd::Mget | Cmd::Del | Cmd::Unlink | Cmd::Exists | Cmd::Touch => SaltPlan::Task(table),
            _ => SaltPlan::Fold(table),
        });
    }
    let e = table.get(args.arg(c.keys[0] as usize))?.clone();
    // Shared, not copied, for a parsed request (`Args::arg_bytes`).
    let argv: Vec<Bytes> = (0..args.argc()).map(|i| args.arg_bytes(i)).collect();
    let op = ops::classify(e.rec.kind, c, &argv);
    let now = v.now_ms;
    // The key's rule, resolved once for the whole plan.
    let rule = v.rules.resolve(&e.key);
    let combine = matches!(rule.write.strategy, Strategy::SaltCombine | Strategy::Auto)
        .then(|| Duration::from_micros(rule.write.combine.window_us));
    let display =
        (rule.read.salted.tier == ReadTier::Display).then_some(rule.read.salted.refresh_ms);
    if let Op::Member(m) = op {
        return Some(member_plan(v, e, m));
    }
    Some(match op {
        Op::Other => SaltPlan::Fold(table),
        Op::Reject(msg) => SaltPlan::Reject(msg),
        // A shard write must not take the whole past i64 (Redis would refuse it, and the
        // merged read could not answer): with no safe known total, read it first.
        Op::Write { delta, ref field }
            if e.rec.writers(now).is_some()
                && !e
                    .known_total(field.as_ref())
                    .is_some_and(|t| ops::write_fits(t, delta)) =>
        {
            SaltPlan::Checked(e, op)
        }
        Op::Write { .. } if e.rec.writers(now).is_none() || !v.fresh => {
            // Announced, not yet in force: the bridge from detection to salting.
            let pending =
                e.rec.demote_ms.is_none() && e.rec.steps.first().is_some_and(|st| st.from_ms > now);
            let bridge = (pending && rule.write.strategy != Strategy::Off)
                .then(|| Duration::from_micros(rule.write.combine.window_us));
            SaltPlan::Base(e, bridge)
        }
        Op::Write { .. } if combine.is_some() => {
            SaltPlan::Combine(e, op, combine.unwrap_or_default())
        }
        Op::Get | Op::HGet(_) if !kinds::of(e.rec.kind).partitioned() => match display {
            Some(ms) => SaltPlan::Display(e, op, ms),
            None if v.careful(&e) => SaltPlan::Careful(e, op),
            None => SaltPlan::Inline(e, op),
        },
        _ if merge::sums(&op) && v.careful(&e) => SaltPlan::Careful(e, op),
        _ => SaltPlan::Inline(e, op),
    })
}

/// The plan for a command on a key salted by member (set, HyperLogLog, sorted set, hash
/// by field).
fn member_plan(v: &SaltView, e: Arc<Salted>, m: MOp) -> SaltPlan {
    let careful = v.careful(&e);
    if is_write(&m) {
        // A member whose shard a step holds (it is being emptied, or not yet known to
        // every proxy) is written to the base key, which every read takes into account.
        let held = written(&m).iter().any(|x| e.rec.held(x, v.now_ms));
        let to_base = e.rec.writers(v.now_ms).is_none() || !v.fresh || held;
        return match m {
            // PFADD's reply says whether a register changed, which the base key tells.
            MOp::PfAdd(_) if to_base => SaltPlan::Base(e, None),
            m => {
                let m = prepare(m, &e, to_base, careful);
                SaltPlan::Inline(e, Op::Member(m))
            }
        };
    }
    // A hash placed by field reads like one placed at random while a fold may run: every
    // part with its fold bookkeeping.
    match m {
        MOp::HGetF(f) if careful => return SaltPlan::Careful(e, Op::HGet(f)),
        MOp::HMGetF(fs) if careful => return SaltPlan::Careful(e, Op::HMGet(fs)),
        _ => {}
    }
    if careful && needs_quiet(&m) {
        return SaltPlan::Quiet(e, m);
    }
    if kinds::of(e.rec.kind).inline(&m, careful, !e.base_maybe()) {
        return SaltPlan::Inline(e, Op::Member(m));
    }
    SaltPlan::Members(e, m, careful)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command;
    use crate::resp::Request;
    use crate::salt::names::Place;
    use crate::salt::record::Kind;
    use crate::salt::record::{Fold, Record};

    struct Two;
    impl Place for Two {
        fn node_of(&self, key: &[u8]) -> usize {
            key.len() % 2
        }
        fn nodes(&self) -> usize {
            2
        }
        fn tag(&self) -> [u8; 2] {
            *b"{}"
        }
    }

    /// A table with `k` (a counter) and `s` (a set), promoted at t=1000 over 2 shards;
    /// `z` (a sorted set) being folded.
    fn table() -> Arc<SaltTable> {
        let mut z = Record::new(Kind::ZSet, vec![1, 2], 1000, 0, "p");
        z.fold = Some(Fold {
            owner: "p#1".into(),
            lease_until_ms: u64::MAX,
            moving: None,
        });
        let entries = [
            ("k", Record::new(Kind::String, vec![1, 2], 1000, 0, "p")),
            ("s", Record::new(Kind::Set, vec![1, 2], 1000, 0, "p")),
            ("z", z),
        ]
        .into_iter()
        .map(|(k, r)| Arc::new(Salted::new(Bytes::from(k), r, &Two)));
        Arc::new(SaltTable::from_entries(entries))
    }

    /// No rule but the defaults; from 9000 ms on, `k`'s merged reads are of the display
    /// tier.
    fn rules_at(now_ms: u64) -> Rules {
        let yaml = "version: 1\nrules:\n  - match: k\n    read: { salted: { tier: display, refresh_ms: 2000 } }\n";
        match now_ms >= 9000 {
            true => Rules::parse(yaml, "r.yaml").unwrap(),
            false => Rules::default(),
        }
    }

    fn decide(line: &str, now_ms: u64, db: u32, in_tx: bool, fresh: bool) -> Option<String> {
        let t = table();
        let rules = rules_at(now_ms);
        let v = SaltView {
            table: &t,
            db,
            in_tx,
            now_ms,
            fresh,
            stale: false,
            rules: &rules,
        };
        let words: Vec<&str> = line.split(' ').collect();
        let req = Request::from_args(&words);
        let c = command::classify(&req).unwrap();
        plan(&v, &req, &c).map(|p| {
            let s = format!("{p:?}");
            s.split('(').next().unwrap().to_string()
        })
    }

    /// What a salted command does when its plan goes on is decided with the plan: the
    /// session never decides again.
    #[test]
    fn a_salted_command_that_goes_on_carries_what_it_does_then() {
        use crate::policy::{Action, HotSet};
        let t = table();
        let rules = Rules::default();
        let hot = HotSet::default();
        let act = |line: &str, now_ms: u64, in_tx: bool| {
            let v = SaltView {
                table: &t,
                db: 0,
                in_tx,
                now_ms,
                fresh: true,
                stale: false,
                rules: &rules,
            };
            let words: Vec<&str> = line.split(' ').collect();
            let req = Request::from_args(&words);
            let c = command::classify(&req).unwrap();
            crate::policy::decide(&c, &req, &hot, &v)
        };
        // Announced, not in force: the increment takes the base key, combined meanwhile
        // (the bridge to salting).
        match act("INCR k", 500, false) {
            Action::Salted(s) if matches!(s.plan, SaltPlan::Base(..)) => {
                assert!(matches!(s.then, Action::Combine { delta: 1, .. }), "{s:?}")
            }
            other => panic!("{other:?}"),
        }
        // Folded first, then on as any command on its key (nothing is hot: forwarded).
        match act("SET k 1", 2000, false) {
            Action::Salted(s) if matches!(s.plan, SaltPlan::Fold(_)) => {
                assert_eq!(s.then, Action::Forward)
            }
            other => panic!("{other:?}"),
        }
        // Inside MULTI: forwarded, whatever the bridge says.
        match act("INCR k", 500, true) {
            Action::Salted(s) => assert_eq!(s.then, Action::Forward),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_command_on_a_salted_key_gets_its_plan() {
        let at = |line: &str, now| decide(line, now, 0, false, true);
        // (command, time, plan) in the order the rules are tried.
        let table: &[(&str, u64, Option<&str>)] = &[
            ("GET cold", 2000, None),
            ("INCR k", 2000, Some("Checked")),
            ("INCR k", 500, Some("Base")),
            ("INCRBY k +5", 2000, Some("Reject")),
            ("GET k", 2000, Some("Inline")),
            ("GET k", 9000, Some("Display")),
            ("GETRANGE k 0 1", 9000, Some("Fold")),
            ("SET k 1", 2000, Some("Fold")),
            ("MGET k cold", 2000, Some("Task")),
            ("RENAME k x", 2000, Some("Fold")),
            ("SADD s a", 2000, Some("Inline")),
            ("SMEMBERS s", 2000, Some("Inline")),
            ("SRANDMEMBER s 2", 2000, Some("Members")),
            ("SPOP s", 2000, Some("Fold")),
            ("ZSCORE z m", 2000, Some("Members")),
            ("ZREM z m", 2000, Some("Quiet")),
            ("ZINCRBY z 1 m", 2000, Some("Inline")),
        ];
        for (line, now, want) in table {
            assert_eq!(at(line, *now).as_deref(), *want, "{line} at {now}");
        }
        assert_eq!(decide("GET k", 2000, 1, false, true), None, "database 1");
        assert_eq!(
            decide("GET k", 2000, 0, true, true).as_deref(),
            Some("Fold")
        );
        assert_eq!(
            decide("SADD s a", 2000, 0, false, false).as_deref(),
            Some("Inline"),
            "a stale registry sends member writes to the base key, in the round"
        );
        assert_eq!(
            decide("PFADD s a", 2000, 0, false, true).as_deref(),
            Some("Fold")
        );
    }

    #[test]
    fn a_write_of_a_member_whose_shard_is_held_goes_to_the_base_key() {
        use crate::salt::record::Step;
        let mut r = Record::new(Kind::Set, vec![1, 2], 1000, 0, "p");
        r.steps.push(Step {
            from_ms: 3000,
            n: 2,
            shards: vec![0, 1],
            hold: vec![1],
        });
        let e = Arc::new(Salted::new(Bytes::from("h"), r, &Two));
        // One member on each shard.
        let on = |i: usize| {
            (0..100)
                .map(|j| format!("m{j}"))
                .find(|m| e.rec.member_salt(m.as_bytes(), 4000) == i)
                .unwrap()
        };
        let (kept, held) = (on(0), on(1));
        let t = Arc::new(SaltTable::from_entries([Arc::clone(&e)]));
        let rules = Rules::default();
        let to_base = |members: &[&str], now_ms: u64| {
            let v = SaltView {
                table: &t,
                db: 0,
                in_tx: false,
                now_ms,
                fresh: true,
                stale: false,
                rules: &rules,
            };
            let mut words = vec!["SADD", "h"];
            words.extend(members);
            let req = Request::from_args(&words);
            let c = command::classify(&req).unwrap();
            match plan(&v, &req, &c) {
                Some(SaltPlan::Inline(_, Op::Member(MOp::SAdd { to_base, check, .. }))) => {
                    assert!(check || !to_base, "a base write asks the shard");
                    to_base
                }
                p => panic!("{p:?}"),
            }
        };
        assert!(
            !to_base(&[&held], 2000),
            "before the step its shard is written"
        );
        assert!(to_base(&[&held], 4000), "held: to the base key");
        assert!(!to_base(&[&kept], 4000), "the other shard is not held");
        assert!(
            to_base(&[&kept, &held], 4000),
            "one held member takes the whole SADD"
        );
    }

    #[test]
    fn a_set_write_goes_to_the_base_key_until_the_promotion_is_in_force() {
        let t = table();
        let rules = Rules::default();
        let v = SaltView {
            table: &t,
            db: 0,
            in_tx: false,
            now_ms: 500,
            fresh: true,
            stale: false,
            rules: &rules,
        };
        let req = Request::from_args(&["SADD", "s", "a"]);
        let c = command::classify(&req).unwrap();
        match plan(&v, &req, &c) {
            Some(SaltPlan::Inline(_, Op::Member(MOp::SAdd { to_base, check, .. }))) => {
                assert!(to_base && check)
            }
            p => panic!("{p:?}"),
        }
    }
}
