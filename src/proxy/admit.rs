//! The admit phase of a session: every key of a command whose first matching rule has an
//! `admit:` section is put to `crate::admit::Admission::check` before the command is
//! decided. A refused command is answered here; a sampled increment is answered here or
//! sent with its delta multiplied; a delayed one waits (the session sends what it read
//! before it first).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::round::Slot;
use super::state::{err_bytes, Session};
use crate::admit::{counter_delta, Admission, NodeLoad, Verdict};
use crate::command::{self, flags};
use crate::metrics::Class;
use crate::resp::Request;

/// Shown the reply of an admitted increment: admission remembers what the key showed.
pub(super) type Hook = super::round::SeenHook;

pub(super) enum Gate {
    /// Go on with this command (rewritten when sampled), after `wait`, and show its reply
    /// to `hook`.
    Pass {
        req: Request,
        hook: Option<Hook>,
        wait: Duration,
    },
    /// Answered here (refused, or a sampled increment not sent), counted as `Class`.
    Done(Slot, Class),
}

pub(super) fn gate(s: &mut Session, req: Request) -> Gate {
    let pass = |req| Gate::Pass {
        req,
        hook: None,
        wait: Duration::ZERO,
    };
    // Who may not run the command at all is told so by the auth check, with no token spent.
    if s.user.is_none() {
        return pass(req);
    }
    let Ok(c) = command::classify(&req) else {
        return pass(req);
    };
    if c.keys.is_empty() {
        return pass(req);
    }
    let f = c.spec.flags;
    let class = if f & flags::WRITE != 0 {
        Class::Write
    } else if f & flags::READ != 0 {
        Class::Read
    } else {
        Class::Other
    };
    let rules = s.ctx.rules.snapshot();
    // Inside MULTI a reply cannot be made up: over the limit, increments are refused too.
    let incr = match (s.tx.is_some(), &c.keys[..]) {
        (false, [_]) => {
            let by = if req.argc() > 2 { req.arg(2) } else { b"" };
            counter_delta(c.spec.name, req.argc(), by)
        }
        _ => None,
    };
    let mut wait = Duration::ZERO;
    let mut record = false;
    let mut scaled = None;
    for &k in &c.keys {
        let key = req.arg(k as usize);
        let Some((rule, a)) = rules.admit(key) else {
            continue;
        };
        let b = &s.ctx.backend;
        let node = b.node(b.node_for(key));
        let load = NodeLoad {
            addr: &node.addr,
            pending: node.metrics.pending.get().max(0) as u64,
        };
        match s.ctx.admit.check(&rules, rule, a, key, incr, load) {
            Verdict::Admit => {}
            Verdict::Record => record = true,
            Verdict::Scaled(n) => scaled = Some(n),
            Verdict::Delay(d) => wait = wait.max(d),
            Verdict::Answer(v) => {
                let (admit, key) = (s.ctx.admit.clone(), Bytes::copy_from_slice(key));
                return Gate::Done(
                    Slot::Deferred(Box::new(move || {
                        let v = admit.last(&key).unwrap_or(v);
                        Bytes::from(format!(":{v}\r\n"))
                    })),
                    class,
                );
            }
            Verdict::Reject(msg) => {
                // As any refused command inside MULTI: the EXEC is aborted.
                if let Some(tx) = s.tx.as_mut() {
                    tx.dirty = true;
                }
                return Gate::Done(Slot::Ready(err_bytes(&msg)), class);
            }
        }
    }
    if !(record || scaled.is_some()) {
        return Gate::Pass {
            req,
            hook: None,
            wait,
        };
    }
    let key = req.arg_bytes(c.keys[0] as usize);
    let req = match (scaled, incr) {
        (Some(n), Some(d)) => match d.checked_mul(n) {
            Some(by) => Request::from_args(&[&b"INCRBY"[..], &key, by.to_string().as_bytes()]),
            None => req,
        },
        _ => req,
    };
    let hook = remember(s.ctx.admit.clone(), Bytes::copy_from_slice(&key));
    Gate::Pass {
        req,
        hook: Some(hook),
        wait,
    }
}

/// A hook that hands an integer reply to `admit.record`.
fn remember(admit: Arc<Admission>, key: Bytes) -> Hook {
    Box::new(move |reply: &[u8]| {
        let Some(rest) = reply.strip_prefix(b":") else {
            return;
        };
        let end = rest.iter().position(|&b| b == b'\r').unwrap_or(rest.len());
        if let Some(v) = crate::resp::parse_i64(&rest[..end]) {
            admit.record(&key, v);
        }
    })
}
