//! The admit phase of a session: every key of a command whose first matching rule has an
//! `admit:` section is put to `crate::admit::Admission::check` before the command is
//! decided. A refused command is answered here; a sampled increment is answered here or
//! sent with its delta multiplied; a delayed one waits (the session sends what it read
//! before it first).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::admit::{Admission, NodeLoad, Verdict};
use crate::command::{self, Access, Classified, Counter};
use crate::metrics::Class;
use crate::proxy::conn::round::Slot;
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::Request;

/// Shown the reply of an admitted increment: admission remembers what the key showed.
pub(in crate::proxy) type Hook = crate::proxy::conn::round::SeenHook;

pub(in crate::proxy) enum Gate {
    /// Go on with this command (rewritten when sampled), after `wait`, and show its reply
    /// to `hook`.
    Pass {
        req: Request,
        c: Classified,
        hook: Option<Hook>,
        wait: Duration,
    },
    /// Answered here (refused, or a sampled increment not sent), counted as `Class`.
    Done(Slot, Class),
}

pub(in crate::proxy) fn gate(s: &mut Session, req: Request, c: Classified) -> Gate {
    // Who may not run the command at all is told so by the auth check, with no token spent.
    if s.user().is_none() || c.keys.is_empty() {
        return Gate::Pass {
            req,
            c,
            hook: None,
            wait: Duration::ZERO,
        };
    }
    let class = match c.access {
        Access::Write => Class::Write,
        Access::Read => Class::Read,
        Access::Other => Class::Other,
    };
    let rules = s.ctx().rules.snapshot();
    // Inside MULTI a reply cannot be made up: over the limit, increments are refused too.
    let incr = match (s.txn().in_multi(), c.counter) {
        (
            false,
            Some(Counter {
                delta: Ok(d),
                field: None,
            }),
        ) => Some(d),
        _ => None,
    };
    let mut wait = Duration::ZERO;
    let mut record = false;
    let mut scaled = None;
    let mut by_bytes = None;
    for &k in &c.keys {
        let key = req.arg(k as usize);
        let Some((rule, a)) = rules.admit(key) else {
            continue;
        };
        if a.limit_bytes_per_sec.is_some() && by_bytes.is_none() {
            by_bytes = Some((Bytes::copy_from_slice(key), *a));
        }
        let b = &s.ctx().backend;
        let node = b.node(b.node_for(key));
        let load = NodeLoad {
            addr: &node.addr,
            pending: node.metrics.pending.get().max(0) as u64,
        };
        match s.ctx().admit.check(&rules, rule, a, key, incr, load) {
            Verdict::Admit => {}
            Verdict::Record => record = true,
            Verdict::Scaled(n) => scaled = Some(n),
            Verdict::Delay(d) => wait = wait.max(d),
            Verdict::Answer(v) => {
                let (admit, key) = (s.ctx().admit.clone(), Bytes::copy_from_slice(key));
                return Gate::Done(
                    Slot::Deferred(Box::new(move || {
                        let v = admit.last(&key).unwrap_or(v);
                        Bytes::from(format!(":{v}\r\n"))
                    })),
                    class,
                );
            }
            Verdict::Reject(msg) => return Gate::Done(s.refuse(err_bytes(&msg)), class),
        }
    }
    if !(record || scaled.is_some()) {
        // A key with a byte limit is charged what the command moved once its reply is
        // written (its first such key: a multi-key reply is not split between keys).
        let hook = by_bytes.map(|(key, a)| {
            let (admit, sent) = (s.ctx().admit.clone(), req.wire_len());
            Box::new(move |reply: &[u8]| admit.charge(&key, &a, sent + reply.len())) as Hook
        });
        return Gate::Pass { req, c, hook, wait };
    }
    let key = req.arg_bytes(c.keys[0] as usize);
    let (req, c) = match (scaled, incr) {
        (Some(n), Some(d)) => match d.checked_mul(n) {
            Some(by) => {
                let new = Request::from_args(&[&b"INCRBY"[..], &key, by.to_string().as_bytes()]);
                // The rewritten command is the one decided and sent.
                match command::classify(&new) {
                    Ok(nc) => (new, nc),
                    Err(_) => (req, c),
                }
            }
            None => (req, c),
        },
        _ => (req, c),
    };
    let hook = remember(s.ctx().admit.clone(), Bytes::copy_from_slice(&key));
    Gate::Pass {
        req,
        c,
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
