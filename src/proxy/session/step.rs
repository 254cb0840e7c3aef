//! One command of a read, as `session::burst` walks them: `begin` (classify, check, admit),
//! `now` (the whole path, when nothing has to wait), and `slow` (the waits: admission's
//! pacing, CLIENT PAUSE, a settle, a flush, a paused plan), boxed by its caller.
//!
//! The split keeps the read's future small. It is allocated per read (an idle connection
//! holds none), and as one `async fn` with every wait inline it was 5.7 kB, copied into
//! its box on every read (bench/README.md, "One pass, no future per command").

use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::{mpsc, watch};

use super::admit::{self, Gate, Hook};
use super::handle::{act, check, handle, proceed, resume};
use super::settle;
use crate::command::{self, Classified, Spec};
use crate::proxy::conn::round::{Queued, RoundBuilder};
use crate::proxy::conn::state::{err_bytes, Decided, Flow, Pending, Session};
use crate::resp::Request;

/// A command classified and admitted, with the pacing admission asked for.
pub(in crate::proxy) struct Begun {
    req: Request,
    c: Classified,
    wait: Duration,
}

/// What a command that must wait goes on from.
pub(in crate::proxy) enum Slow {
    /// Before it is handled: admission's pacing or CLIENT PAUSE. Boxed, so that the
    /// common path's `Result<Flow, Slow>` stays small.
    Before(Box<Begun>),
    /// Handled, and its flow waits (`Flow::Settle`, `Flush`, `Wait`).
    After(Flow),
}

/// classify -> check (auth, ACL) -> admit. None when the command is answered already (refused, or admission
/// answered it); else the command, the hook that sees its reply, and its MONITOR line.
pub(in crate::proxy) fn begin(
    s: &mut Session,
    req: Request,
    rb: &mut RoundBuilder,
    last: &mut Option<&'static Spec>,
    monitored: bool,
) -> Option<(Begun, Option<Hook>, Option<BytesMut>)> {
    // command: the request resolved once, for every phase after it.
    let c = match command::classify(&req) {
        Ok(c) => {
            *last = Some(c.spec);
            c
        }
        Err(e) => {
            let slot = s.refuse(err_bytes(&e.to_string()));
            rb.slots.push(slot);
            return None;
        }
    };
    // check: a command the ACL refuses spends no admission token, and is not shown to
    // monitors (Redis feeds MONITOR only what it runs).
    if !check(s, &req, &c, rb) {
        return None;
    }
    // admit
    let (req, c, hook, wait) = if s.admits() {
        match admit::gate(s, req, c) {
            Gate::Done(slot, class) => {
                rb.count(class);
                rb.slots.push(slot);
                return None;
            }
            Gate::Pass { req, c, hook, wait } => (req, c, hook, wait),
        }
    } else {
        (req, c, None, Duration::ZERO)
    };
    // Redis shows no CMD_ADMIN command to monitors. The scripts (EVAL, EVALSHA, FCALL and
    // their _RO forms) are CMD_SKIP_MONITOR only because Redis writes their line itself,
    // in evalCommand and fcallCommand, before the script runs: so they are shown here.
    let monitor = (monitored && !c.spec.has(command::flags::ADMIN))
        .then(|| crate::proxy::registry::monitor::args(&req));
    Some((Begun { req, c, wait }, hook, monitor))
}

/// The command's whole path when nothing on it waits: its flow, or where to go on from.
pub(in crate::proxy) fn now(
    s: &mut Session,
    b: Begun,
    rb: &mut RoundBuilder,
) -> Result<Flow, Slow> {
    if !b.wait.is_zero() || s.ctx().pause.holds(settle::writes(&b.c)).is_some() {
        return Err(Slow::Before(Box::new(b)));
    }
    match handle(s, &b.req, &b.c, rb) {
        f @ (Flow::Settle(_) | Flow::Flush(_) | Flow::Wait(_)) => Err(Slow::After(f)),
        f => Ok(f),
    }
}

/// The waits of a command, and the rest of its path; `mark` is where its slots start in
/// `rb` (a round sent ahead starts a fresh one). None when the client is gone.
pub(in crate::proxy) async fn slow(
    s: &mut Session,
    from: Slow,
    rb: &mut RoundBuilder,
    tx: &mpsc::Sender<Queued>,
    killed: &mut watch::Receiver<bool>,
    mark: &mut usize,
) -> Option<Flow> {
    let mut next = match from {
        Slow::Before(b) => {
            let Begun { req, c, wait } = *b;
            if !wait.is_zero() {
                // What was read before it need not wait with it.
                if !rb.is_empty() && !settle::flush(s, rb, tx).await {
                    return None;
                }
                // The wait counts against the command's request_timeout_ms (its round
                // was read before it), so it is never longer.
                let timeout = s.ctx().backend.request_timeout.unwrap_or(wait);
                tokio::time::sleep(wait.min(timeout)).await;
            }
            if s.ctx().pause.holds(settle::writes(&c)).is_some()
                && !settle::paused(s, &c, rb, tx, killed).await
            {
                return None;
            }
            *mark = rb.slots.len();
            handle(s, &req, &c, rb)
        }
        Slow::After(flow) => flow,
    };
    loop {
        next = match next {
            Flow::Settle(p) => {
                if !settle::settle(s, rb, tx, s.proto()).await {
                    return None;
                }
                *mark = 0;
                let Pending { req, c } = *p;
                proceed(s, &req, &c, true, rb)
            }
            Flow::Flush(p) => {
                if !settle::flush(s, rb, tx).await {
                    return None;
                }
                *mark = 0;
                let Decided { req, c, action } = *p;
                act(s, &req, &c, action, rb)
            }
            Flow::Wait(p) => resume(s, p, rb).await,
            done => return Some(done),
        };
    }
}
