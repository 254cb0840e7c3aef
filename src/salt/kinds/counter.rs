//! Counters: a string counter or a hash of counters salted whole (each shard holds a part
//! of every field). INCR, INCRBY, DECR, DECRBY and HINCRBY go to the shard writers use
//! now (`ops::plan`); GET, HGET, HMGET and HGETALL add up every part (`merge`). The fold
//! moves a shard's value with the journal's take-then-add (`journal::move_counters`).

use bytes::Bytes;

use crate::backend::Backend;
use crate::command::{Classified, Cmd};
use crate::salt::journal::{apply_counters, move_counters, Claimed, Shape};
use crate::salt::kind::{Facts, Op, SaltKind};
use crate::salt::record::{Move, Record};
use crate::salt::{Fut, Salt, SaltError};

/// What `c` (its arguments `args`, command name first, the salted key second) does to a
/// salted counter or hash of counters. An increment's delta is the classified command's
/// (`Classified::counter`: Redis's error for one that is not an integer, checked before
/// the key, as Redis does).
pub fn classify(c: &Classified, args: &[Bytes]) -> Op {
    let n = args.len();
    match (c.spec.cmd, &c.counter) {
        (Cmd::Incr | Cmd::Decr | Cmd::Incrby | Cmd::Decrby | Cmd::Hincrby, Some(k)) => {
            match k.delta {
                Ok(delta) => Op::Write {
                    delta,
                    field: k.field.map(|f| args[f as usize].clone()),
                },
                Err(e) => Op::Reject(e),
            }
        }
        _ => read(c.spec.cmd, n, args),
    }
}

/// A read of a salted counter or hash of counters.
fn read(cmd: Cmd, n: usize, args: &[Bytes]) -> Op {
    match (cmd, n) {
        (Cmd::Get, 2) => Op::Get,
        (Cmd::Hget, 3) => Op::HGet(args[2].clone()),
        (Cmd::Hmget, n) if n >= 3 => Op::HMGet(args[2..].to_vec()),
        (Cmd::Hgetall, 2) => Op::HGetAll,
        _ => Op::Other,
    }
}

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
    fn classify(&self, c: &Classified, args: &[Bytes]) -> Op {
        classify(c, args)
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
