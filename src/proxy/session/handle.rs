//! One command of a session: `check` (auth, ACL; `step::begin` runs it before admission)
//! -> order (another connection, a task) ->
//! decide (`plan::decide`, once) -> observe (`plan::observe`) -> act: the plan carried out
//! into the read's round. `session` calls it for each command it reads.
//!
//! All of it is synchronous: a command that must wait on the way (for a fill of its key,
//! for a salted key's task, for a subscription's connection) comes back as `Flow::Wait`
//! with everything needed to go on, and `resume` does the wait. So a plain command costs
//! no future at all: as `async fn`s, the chain `handle` -> `proceed` -> `act` laid out
//! futures of 5.2, 2.4 and 0.6 kB, each copied into its caller's per command, and the
//! read's future was 13.4 kB (memmove was the first user-space symbol of a P16 profile,
//! bench/README.md "One pass, no future per command").

use super::plan::{decide, observe, own_connection};
use crate::command::{Classified, Cmd, Route};
use crate::metrics::Class;
use crate::policy::{self, Action};
use crate::proxy::act::mitigation::{
    cached_mget, cached_read, combine, invalidate_cached, wait_fills,
};
use crate::proxy::act::route::{
    all_nodes, forward_keyed, is_pubsub_command, keys_node, pubsub_node, push, scan_one, split,
};
use crate::proxy::answer::local;
use crate::proxy::answer::local::queue_in_tx;
use crate::proxy::conn::round::{Blocked, Merge, RoundBuilder, Slot};
use crate::proxy::conn::state::{
    blocking_worker, err_bytes, Decided, Flow, Paused, Pending, Session, Wait,
};
use crate::proxy::conn::tunnel;
use crate::resp::Request;

/// decide -> observe -> act, for one classified command that passed `check`.
/// The command is borrowed: it is moved (cloned) only onto the rare paths that keep it
/// past this call (`Pending`, `Decided`, `Paused`).
pub(in crate::proxy) fn handle(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    rb: &mut RoundBuilder,
) -> Flow {
    // The keys a combined write of this session must not overtake (see `Order`); a
    // command without keys that reaches a node may touch any.
    if s.tracks_keys() {
        let known = !c.keys.is_empty() || matches!(c.route, Route::Local);
        rb.note_keys(req, &c.keys, known);
    }
    proceed(s, req, c, false, rb)
}

/// The check phase: authentication, then the ACL. False when the command is refused (its
/// error is in `rb`). It runs before admission, so a command the ACL refuses spends no
/// token of its key's bucket (`step::begin`).
pub(in crate::proxy) fn check(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    rb: &mut RoundBuilder,
) -> bool {
    s.refresh_user();
    match s.user() {
        None if !matches!(c.spec.cmd, Cmd::Auth | Cmd::Hello | Cmd::Quit | Cmd::Reset) => {
            rb.slots
                .push(Slot::Ready(err_bytes("NOAUTH Authentication required.")));
            return false;
        }
        Some(u) if !u.unrestricted() => {
            if let Err(d) = u.check(c, req) {
                let label = crate::metrics::DeniedLabel {
                    user: u.name.clone(),
                    reason: d.reason(),
                };
                s.ctx()
                    .metrics
                    .security
                    .acl_denied
                    .get_or_create(&label)
                    .inc();
                s.log_refusal(d.reason(), d.object(c), &u.name.clone());
                let slot = s.refuse(err_bytes(&d.message()));
                rb.slots.push(slot);
                return false;
            }
        }
        _ => {}
    }
    true
}

/// An allowed command: ordered against the session's earlier ones, decided once, carried
/// out. `settled`: every earlier reply is in.
pub(in crate::proxy) fn proceed(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    settled: bool,
    rb: &mut RoundBuilder,
) -> Flow {
    // A command that takes another connection to its node than the session's last one
    // (a script's lane, WATCH's connection, a blocking command's) leaves once everything
    // the session sent before has arrived: two connections are not ordered at the node.
    let lane_change = !s.txn().in_multi()
        && !matches!(
            c.route,
            Route::Local
                | Route::Transaction
                | Route::Subscribe
                | Route::Unsupported(_)
                | Route::Blocking
                | Route::Kill
        )
        && s.switch_lane(c.spec.cmd);
    let switch = s.tracking.is_some() && crate::proxy::answer::client_cache::switches(s, req, c);
    if !settled && (lane_change || switch || own_connection(s, req, c)) {
        return Flow::Settle(Box::new(Pending {
            req: req.clone(),
            c: c.clone(),
        }));
    }
    // decide
    let action = decide(s, req, c);
    let task = match &action {
        Action::Salted(s) => s.plan.needs_flush(),
        Action::Idempotent { .. } => crate::proxy::act::salted::idempotent_is_task(s, req),
        _ => false,
    };
    if task && !rb.jobs.is_empty() {
        return Flow::Flush(Box::new(Decided {
            req: req.clone(),
            c: c.clone(),
            action,
        }));
    }
    act(s, req, c, action, rb)
}

/// observe -> act: carries out the decided plan; a single-key read's reply is noted for
/// detection by cost (`cost`).
pub(in crate::proxy) fn act(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    action: Action,
    rb: &mut RoundBuilder,
) -> Flow {
    let cost = crate::proxy::conn::cost::candidate(s.detects(), req, c, || {
        s.ctx().rules.load().cost_floors()
    });
    let before = rb.slots.len();
    match carry_out(s, req, c, action, rb) {
        Ok(flow) => {
            rb.note_cost(cost, before);
            flow
        }
        Err(wait) => Flow::Wait(Box::new(Paused {
            req: req.clone(),
            c: c.clone(),
            cost,
            before,
            wait,
        })),
    }
}

/// The wait of a paused command, then the rest of its path (which may pause again).
pub(in crate::proxy) async fn resume(
    s: &mut Session,
    p: Box<Paused>,
    rb: &mut RoundBuilder,
) -> Flow {
    let Paused {
        req,
        c,
        cost,
        before,
        wait,
    } = *p;
    let next = match wait {
        Wait::Fills(action) => {
            wait_fills(s, &req, &c).await;
            after_fills(s, &req, &c, action, rb)
        }
        Wait::Fold(fold) => {
            let (table, then) = *fold;
            let next = crate::proxy::act::salted::fold_first(s, &req, &c, &table, rb).await;
            after_salted(s, &req, &c, next, then, rb)
        }
        Wait::Subscribe(node) => {
            let n = s.ctx().backend.node(node).clone();
            let mut hs = n.handshake(s.proto(), s.db());
            // The client talks to the node from now on: it keeps its name there.
            hs.name = s.name().cloned();
            let now = rb.jobs.is_empty();
            match tunnel::open(&n, &hs, req.wire(), now).await {
                Ok(start) => Ok(Flow::Tunnel(Box::new(start))),
                Err(e) => {
                    rb.slots
                        .push(Slot::Ready(err_bytes(&format!("ERR saltshaker: {e}"))));
                    Ok(Flow::Continue)
                }
            }
        }
    };
    match next {
        Ok(flow) => {
            rb.note_cost(cost, before);
            flow
        }
        Err(wait) => Flow::Wait(Box::new(Paused {
            req,
            c,
            cost,
            before,
            wait,
        })),
    }
}

/// observe, then the plan: `Err` when it must wait first.
fn carry_out(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    mut action: Action,
    rb: &mut RoundBuilder,
) -> Result<Flow, Wait> {
    // observe
    let class = observe(s, req, c);
    rb.count(class);
    if s.tracking.is_some() {
        crate::proxy::answer::client_cache::note(s, req, c, class, &mut action);
    }
    if class != Class::Write {
        return on_base(s, req, c, action, rb);
    }
    if !s.order.no_fills() {
        return Err(Wait::Fills(action));
    }
    after_fills(s, req, c, action, rb)
}

/// A write once no fill of its keys is in flight: what the cache holds of them goes first.
fn after_fills(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    action: Action,
    rb: &mut RoundBuilder,
) -> Result<Flow, Wait> {
    if !s.txn().in_multi() {
        invalidate_cached(s, req, c, &s.ctx().hot.load(), rb);
    }
    on_base(s, req, c, action, rb)
}

/// act: a salted key's plan, or the key's usual path.
fn on_base(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    action: Action,
    rb: &mut RoundBuilder,
) -> Result<Flow, Wait> {
    match action {
        Action::Idempotent { delta } => {
            crate::proxy::act::salted::idempotent(s, req, delta, rb);
            Ok(Flow::Continue)
        }
        Action::Salted(salted) => {
            let policy::Salted { plan, then } = *salted;
            match crate::proxy::act::salted::act_now(s, req, c, plan, rb) {
                Ok(next) => after_salted(s, req, c, next, then, rb),
                Err(table) => Err(Wait::Fold(Box::new((table, then)))),
            }
        }
        action => plain(s, req, c, action, rb),
    }
}

/// What a salted command does after its plan: answered, or on as usual.
fn after_salted(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    next: crate::proxy::act::salted::Next,
    then: Action,
    rb: &mut RoundBuilder,
) -> Result<Flow, Wait> {
    match next {
        crate::proxy::act::salted::Next::Done => Ok(Flow::Continue),
        // Folded, or a write the base key takes: on as the plan's `then` says.
        crate::proxy::act::salted::Next::Forward => plain(s, req, c, then, rb),
    }
}

/// Combined, cached or queued in a transaction, else sent the way its route says.
fn plain(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    action: Action,
    rb: &mut RoundBuilder,
) -> Result<Flow, Wait> {
    match action {
        Action::Combine {
            delta,
            field,
            window,
        } => {
            // A batch leaves on its own schedule: only when nothing of this session is
            // still on its way, or it could overtake it (then: a plain command).
            if crate::proxy::act::mitigation::may_combine_now(s, rb, req.arg(c.keys[0] as usize)) {
                combine(s, req, c, delta, field, window, rb);
                return Ok(Flow::Continue);
            }
            s.ctx().metrics.combine.held_back.inc();
        }
        Action::Cache(p) => {
            if cached_read(s, req, c, p, rb) {
                return Ok(Flow::Continue);
            }
        }
        Action::CachePerKey(per_key) => {
            if cached_mget(s, req, c, &per_key, rb) {
                return Ok(Flow::Continue);
            }
        }
        Action::Forward | Action::Salted(_) | Action::Idempotent { .. } => {}
    }
    if s.txn().in_multi()
        && !matches!(
            c.spec.cmd,
            Cmd::Exec | Cmd::Discard | Cmd::Multi | Cmd::Watch | Cmd::Quit | Cmd::Reset
        )
    {
        let slot = queue_in_tx(s, req, c);
        rb.slots.push(slot);
        return Ok(Flow::Continue);
    }
    match c.route {
        Route::Keyed => forward_keyed(s, req, c, rb),
        Route::Blocking => {
            let slot = match keys_node(s, req, c) {
                Ok(node) => {
                    let w = blocking_worker(s, node);
                    let rx = w.call(vec![req.wire()], 1);
                    let on = Some((node, w.node_id()));
                    Slot::Blocking(rx, Blocked::new(&s.me, on))
                }
                Err(e) => Slot::Ready(e),
            };
            rb.slots.push(slot);
        }
        Route::Split(kind) => split(s, req, c, kind, rb),
        Route::AllNodes(agg) => all_nodes(s, req, c, agg, rb),
        // A command learned from the nodes whose keys the proxy cannot find: one node
        // places them itself; over several, a node is asked where they are.
        Route::AnyNode
            if c.spec.has(crate::command::flags::UNPLACED) && !s.ctx().backend.is_single() =>
        {
            crate::proxy::act::unplaced::via_getkeys(s, req, c, rb)
        }
        Route::AnyNode => {
            let node = if is_pubsub_command(c.spec.cmd) {
                pubsub_node(s, req, c.spec.cmd)
            } else {
                Ok(s.ctx().backend.any_node())
            };
            match node {
                Ok(node) => {
                    let part = push(s, rb, node, req.wire());
                    rb.slots.push(Slot::Reply(part));
                }
                Err(e) => rb.slots.push(Slot::Ready(e)),
            }
        }
        Route::Scan => scan_one(s, req, rb),
        Route::Kill => crate::proxy::act::route::kill(s, req, rb),
        Route::RandomKey => {
            let parts = crate::proxy::act::route::to_masters(s, req, rb);
            rb.slots
                .push(Slot::Merge(Box::new(Merge::FirstNonNil(parts))));
        }
        Route::Local => return Ok(local::handle(s, req, c, rb)),
        Route::Transaction => return Ok(local::transaction(s, req, c, rb)),
        Route::Subscribe => match pubsub_node(s, req, c.spec.cmd) {
            Ok(node) => {
                // Nothing read before it is still to send: the SUBSCRIBE leaves now, on a
                // connection opened ahead, if one waits (`tunnel::open_now`).
                if rb.jobs.is_empty() && s.db() == 0 {
                    let n = s.ctx().backend.node(node).clone();
                    if let Some(start) = tunnel::open_now(&n, s.proto(), s.name(), req.wire()) {
                        return Ok(Flow::Tunnel(Box::new(start)));
                    }
                }
                return Err(Wait::Subscribe(node));
            }
            Err(e) => rb.slots.push(Slot::Ready(e)),
        },
        Route::Unsupported(why) => rb
            .slots
            .push(Slot::Ready(err_bytes(&format!("ERR saltshaker: {why}")))),
    }
    Ok(Flow::Continue)
}
