//! Counters: a string counter or a hash of counters salted whole (each shard holds a part
//! of every field). INCR, INCRBY, DECR, DECRBY and HINCRBY go to the shard writers use
//! now (`ops::plan`); GET, HGET, HMGET and HGETALL add up every part (`merge`). The fold
//! moves a shard's value with the journal's take-then-add (`journal::move_counters`).

use bytes::Bytes;

use crate::backend::Backend;
use crate::command::Cmd;
use crate::salt::journal::{apply_counters, move_counters, Claimed, Shape};
use crate::salt::kind::{Facts, Op, SaltKind};
use crate::salt::record::{Move, Record};
use crate::salt::{Fut, Salt, SaltError};

/// What `args` (command name first, the salted key second) does to a salted counter or
/// hash of counters.
pub fn classify(cmd: Cmd, args: &[Bytes]) -> Op {
    // Redis checks the increment before it looks at the key, with string2ll's rules.
    let int = |i: usize| -> Option<i64> { crate::resp::parse_i64(args.get(i)?) };
    let n = args.len();
    let write = |delta: Option<i64>, field: Option<Bytes>| match delta {
        Some(delta) => Op::Write { delta, field },
        None => Op::Reject(NOT_AN_INTEGER),
    };
    match (cmd, n) {
        (Cmd::Incr, 2) => write(Some(1), None),
        (Cmd::Decr, 2) => write(Some(-1), None),
        (Cmd::Incrby, 3) => write(int(2), None),
        (Cmd::Decrby, 3) => match int(2) {
            Some(d) => d
                .checked_neg()
                .map_or(Op::Reject("ERR decrement would overflow"), |delta| {
                    write(Some(delta), None)
                }),
            None => Op::Reject(NOT_AN_INTEGER),
        },
        (Cmd::Hincrby, 4) => write(int(3), Some(args[2].clone())),
        (Cmd::Get, 2) => Op::Get,
        (Cmd::Hget, 3) => Op::HGet(args[2].clone()),
        (Cmd::Hmget, n) if n >= 3 => Op::HMGet(args[2..].to_vec()),
        (Cmd::Hgetall, 2) => Op::HGetAll,
        _ => Op::Other,
    }
}

/// Redis's reply to an increment that is not an integer.
const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";

/// The kind of string counters (`STRINGS`) and of hashes of counters salted by key
/// (`HASHES`).
pub struct Counters {
    shape: Shape,
}

pub static STRINGS: Counters = Counters {
    shape: Shape::String,
};
pub static HASHES: Counters = Counters { shape: Shape::Hash };

impl SaltKind for Counters {
    fn classify(&self, cmd: Cmd, args: &[Bytes]) -> Op {
        classify(cmd, args)
    }

    fn move_shard<'a>(
        &'a self,
        backend: &'a Backend,
        salt: &'a Salt,
        key: &'a [u8],
        c: &'a mut Claimed,
        i: usize,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(move_counters(backend, salt, key, c, i, self.shape))
    }

    fn apply<'a>(
        &'a self,
        backend: &'a Backend,
        key: &'a [u8],
        rec: &'a Record,
        mv: &'a Move,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(apply_counters(backend, key, rec, mv, self.shape))
    }

    fn family(&self) -> &'static str {
        match self.shape {
            Shape::String => "counters",
            Shape::Hash => "hashes",
        }
    }

    fn takes(&self, f: Facts) -> bool {
        match self.shape {
            Shape::String => matches!(f.redis_type, None | Some("string")) && !f.hll,
            Shape::Hash => matches!(f.redis_type, None | Some("hash")) && !f.by_field,
        }
    }

    fn partitioned(&self) -> bool {
        false
    }

    fn idempotent(&self) -> bool {
        self.shape == Shape::String
    }
}
