//! The session's side of salting. Most commands on a salted key are served inside the
//! round like any other command: the command on each part (or on the one shard written)
//! joins the round's job for that part's node, and a merge slot builds the reply, so order
//! and read-your-writes hold exactly as for a plain key, and a pipeline costs one job per
//! node, not one per command (measured in `bench/write_hot.sh`: a first version with one
//! task per command served salted GETs at a tenth of plain GETs' rate).
//!
//! Combined shard writes go through the shard's combine batch, ordered by the session's
//! barrier like any combined write. Multi-key commands over salted keys, and summing reads
//! while a fold may move values, are answered by tasks: a task starts after the session's
//! earlier commands have landed (the round built so far is flushed first, and the last
//! round's replies awaited), and the session's later commands wait for it. A command that
//! cannot be merged first moves the shards into the base key, then goes on as usual.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::route::push;
use crate::command::Classified;
use crate::mitigate::combine::{BatchKey, Pace};
use crate::policy::{SaltPlan, SaltPlan as Plan};
use crate::proxy::conn::round::{Keys, Merge, RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{Proto, Request};
use crate::salt::kind::{is_write, only_reads, Op};
use crate::salt::kinds;
use crate::salt::merge;
use crate::salt::ops;
use crate::salt::{fold, idem, now_ms, Salted};

/// Counts what `plan` does in the salting metrics: shard writes, writes the base key
/// takes, merged reads.
fn count(s: &Session, plan: &SaltPlan) {
    let m = &s.ctx().salt.metrics;
    let c = match plan {
        Plan::Base(..) => &m.base_writes,
        Plan::Inline(_, Op::Member(op)) if is_write(op) => match op.to_base() {
            true => &m.base_writes,
            false => &m.shard_writes,
        },
        Plan::Inline(_, Op::Write { .. }) | Plan::Combine(..) | Plan::Checked(..) => {
            &m.shard_writes
        }
        Plan::Inline(..) | Plan::Careful(..) | Plan::Members(..) | Plan::Quiet(..) => {
            &m.merged_reads
        }
        Plan::Display(..) => &m.display_reads,
        Plan::Task(_) | Plan::Fold(_) | Plan::Reject(_) => return,
    };
    c.inc();
}

/// What the session does next.
pub(in crate::proxy) enum Next {
    /// Answered (in the round, by a task, or with an error).
    Done,
    /// Go on with the usual path (the key's shards are folded in if that was needed).
    Forward,
}

/// Carries out `plan` inside the round: every plan but a fold, whose table comes back for
/// `fold_first` to wait on. Synchronous, so that the common salted command (a merged read, a shard
/// write) takes the request path's synchronous step, as a plain command does. Going through
/// the waiting step, each boxed its futures per command: a salted GET cost 1.5-1.9x a plain
/// GET's proxy CPU at pipeline 16 (`bench/salted_get.sh`), against 1.3-1.4x for the build
/// that answered them before the one-pass work, where `perf` put 7% of the samples in
/// `memmove` and 8% in malloc and free.
pub(in crate::proxy) fn act_now(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    plan: SaltPlan,
    rb: &mut RoundBuilder,
) -> Result<Next, Arc<crate::salt::SaltTable>> {
    let args: Vec<Bytes> = (0..req.argc()).map(|i| req.arg_bytes(i)).collect();
    let spec = c.spec;
    // Something of the session on the key still on its way: an inline shard write, in
    // order.
    let plan = match plan {
        Plan::Combine(e, op, _) if !super::mitigation::may_combine_now(s, rb, &e.key) => {
            s.ctx().metrics.combine.held_back.inc();
            Plan::Inline(e, op)
        }
        p => p,
    };
    // A read of the display tier right after this session's own write of the key (in
    // this round, or in one whose replies are not all in) merges exactly: it must see it.
    let plan = match plan {
        Plan::Display(e, op, _) if super::mitigation::written_pending(s, rb, &e.key) => {
            match s.ctx().salt.careful(&e, now_ms()) {
                true => Plan::Careful(e, op),
                false => Plan::Inline(e, op),
            }
        }
        p => p,
    };
    count(s, &plan);
    if matches!(
        &plan,
        Plan::Base(..) | Plan::Inline(_, Op::Write { .. }) | Plan::Combine(..) | Plan::Checked(..)
    ) {
        rb.written.push(req.arg_bytes(c.keys[0] as usize));
    }
    match plan {
        Plan::Base(e, _) => {
            if crate::salt::kinds::of(e.rec.kind).partitioned() {
                e.note_base_write();
            }
            // The base key takes it as a plain command: no reply here to count it by.
            e.rollup.stale();
            Ok(Next::Forward)
        }
        Plan::Display(e, op, ms) => {
            display(s, e, op, ms, &args, rb);
            Ok(Next::Done)
        }
        Plan::Reject(msg) => {
            rb.slots.push(Slot::Ready(err_bytes(msg)));
            Ok(Next::Done)
        }
        Plan::Inline(e, op) => {
            if same_read_as_last(rb, &e, &op) {
                s.ctx().salt.metrics.shared_reads.inc();
                return Ok(Next::Done);
            }
            let (cmds, part) = ops::plan(&e, &op, &args, now_ms(), false);
            let parts = cmds.into_iter().map(|(n, w)| push(s, rb, n, w)).collect();
            let write = matches!(op, Op::Write { .. });
            rb.slots.push(Slot::Merge(Box::new(Merge::Salted {
                parts,
                op,
                entry: e,
                part,
                ctx: write.then(|| s.ctx().clone()),
            })));
            Ok(Next::Done)
        }
        Plan::Careful(e, op) => {
            let ctx = s.ctx().clone();
            let proto = s.proto();
            later(s, rb, async move {
                merge::careful(&ctx.backend, &e, op, &args)
                    .await
                    .to_bytes(proto)
            });
            Ok(Next::Done)
        }
        Plan::Combine(e, op, window) => {
            combine(s, e, op, window, &args, rb);
            Ok(Next::Done)
        }
        Plan::Checked(e, op) => {
            let ctx = s.ctx().clone();
            let proto = s.proto();
            later(s, rb, async move {
                ops::checked_write(&ctx.backend, &ctx.salt, &e, op, &args)
                    .await
                    .to_bytes(proto)
            });
            Ok(Next::Done)
        }
        Plan::Members(e, m, careful) => {
            let ctx = s.ctx().clone();
            let proto = s.proto();
            later(s, rb, async move {
                kinds::of(e.rec.kind)
                    .read(&ctx.backend, &e, &m, careful, proto == Proto::Resp3)
                    .await
                    .unwrap_or_else(|e| e)
                    .to_bytes(proto)
            });
            Ok(Next::Done)
        }
        Plan::Quiet(e, m) => {
            let ctx = s.ctx().clone();
            let proto = s.proto();
            later(s, rb, async move {
                ops::quiet(&ctx.backend, &ctx.salt, &e.key, &m, &args)
                    .await
                    .to_bytes(proto)
            });
            Ok(Next::Done)
        }
        Plan::Task(table) => {
            let ctx = s.ctx().clone();
            let proto = s.proto();
            later(s, rb, async move {
                ops::multi(&ctx.backend, &ctx.salt, &table, &args, spec, proto).await
            });
            Ok(Next::Done)
        }
        Plan::Fold(table) => Err(table),
    }
}

/// Folds the command's salted keys (those in `table`) into their base keys, after the
/// session's earlier commands have landed: then the command goes on as usual.
pub(in crate::proxy) async fn fold_first(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    table: &crate::salt::SaltTable,
    rb: &mut RoundBuilder,
) -> Next {
    let name = c.spec.name;
    // Not mergeable (or inside MULTI): fold the shards into the base key, then run it.
    s.order.wait_all().await;
    for &k in &c.keys {
        let key = req.arg(k as usize);
        if table.get(key).is_none() {
            continue;
        }
        if let Some(e) = table.get(key) {
            e.forget();
        }
        if let Err(e) = fold::move_all(&s.ctx().backend, &s.ctx().salt, key).await {
            tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, command = name, "could not fold a salted key before a command that needs its whole value");
            let slot = s.refuse(err_bytes(&format!(
                "ERR saltshaker: {name} needs the salted key folded first, and that failed: {e}"
            )));
            rb.slots.push(slot);
            return Next::Done;
        }
    }
    Next::Forward
}

/// Whether `op` on `e` is the same read as the command just before it in this round (a
/// pipeline reading one hot salted key); if so, its slot is `Slot::Again`, a copy of that
/// read's reply.
///
/// Exact: both commands were read before the round is sent and are answered after its
/// replies are in, so the one merged read falls inside both commands' lifetimes, and
/// nothing of this session comes between them. Only reads that answer the same every time
/// share (SRANDMEMBER and SSCAN do not).
fn same_read_as_last(rb: &mut RoundBuilder, e: &Arc<Salted>, op: &Op) -> bool {
    use crate::salt::kind::MOp;
    let pure = match op {
        Op::Get | Op::HGet(_) | Op::HMGet(_) | Op::HGetAll | Op::Exists => true,
        Op::Member(m) => only_reads(m) && !matches!(m, MOp::SRandMember(_) | MOp::SScan { .. }),
        _ => false,
    };
    // The slot a repeat would copy: the last one, or the one a run of repeats copies.
    let base = match rb.slots.last() {
        Some(Slot::Again) => rb.repeated,
        Some(Slot::Merge(_)) => rb.slots.len() - 1,
        _ => return false,
    };
    let same = match &rb.slots[base] {
        Slot::Merge(m) => matches!(&**m, Merge::Salted {
            op: last,
            entry,
            ctx: None,
            ..
        } if pure && Arc::ptr_eq(entry, e) && last == op),
        _ => false,
    };
    if same {
        rb.repeated = base;
        rb.slots.push(Slot::Again);
    }
    same
}

/// A salted write through its shard's combine batch: the batch's exact shard value becomes
/// the estimate of the whole when the reply is written. The session's barrier orders it
/// before the session's later jobs, as for any combined write.
fn combine(
    s: &mut Session,
    e: Arc<Salted>,
    op: Op,
    window: std::time::Duration,
    args: &[Bytes],
    rb: &mut RoundBuilder,
) {
    // The plan combines writes only; every command gets its slot.
    let Op::Write { delta, field } = &op else {
        rb.slots.push(Slot::Ready(err_bytes(
            "ERR saltshaker: internal: a combined salted write without a combine rule",
        )));
        return;
    };
    // The combine window this write falls in, counted from the process's start (so
    // proxies started apart do not all take the same shard at once): every write of one
    // window joins one shard's batch.
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let since = START.get_or_init(std::time::Instant::now).elapsed();
    let turn = (since.as_micros() / window.as_micros().max(1)) as u64;
    let (mut cmds, part) = ops::plan_in_turn(&e, &op, args, now_ms(), false, Some(turn));
    let (node, cmd) = cmds.remove(0);
    let conn = super::mitigation::combine_conn(s, node, 0, &e.parts[part]);
    let bk = BatchKey {
        node,
        db: 0,
        key: e.parts[part].clone(),
        field: field.clone(),
    };
    let pending = s
        .ctx()
        .combiner
        .add(bk, conn, *delta, cmd, Pace::Turn(window));
    s.order.combined(Keys::hash(&e.key), pending.done);
    rb.combined();
    let (ctx, proto) = (s.ctx().clone(), s.proto());
    let then = move |raw: Bytes| -> Bytes {
        let v = match crate::resp::parse_value(&raw) {
            Ok(Some((v, _))) => v,
            _ => return raw,
        };
        let (v, created) = crate::salt::merge::written(&e, &op, part, &v);
        if created {
            tokio::spawn(async move { ops::inherit_expiry(&ctx.backend, &e, part).await });
        }
        v.to_bytes(proto)
    };
    rb.slots
        .push(Slot::LaterThen(pending.reply, Box::new(then)));
}

/// `SALTSHAKER.INCRBY key delta id`: one script in the round, like any command, or, when
/// the ID must be looked up elsewhere first, a task like any salted command that leaves
/// the round (once the session's earlier commands have landed, before its later ones).
pub(in crate::proxy) fn idempotent(
    s: &mut Session,
    req: &Request,
    delta: i64,
    rb: &mut RoundBuilder,
) {
    let refuse = if s.db() != 0 {
        Some("ERR saltshaker: SALTSHAKER.INCRBY works in database 0 only")
    } else if !s.ctx().salt.enabled {
        Some("ERR saltshaker: SALTSHAKER.INCRBY needs a pool that places keys by hash")
    } else {
        None
    };
    if let Some(msg) = refuse {
        rb.slots.push(Slot::Ready(err_bytes(msg)));
        return;
    }
    let (key, id) = (req.arg_bytes(1), req.arg_bytes(3));
    rb.written.push(key.clone());
    let now = now_ms();
    let entry = s.ctx().salt.table.load().get(&key).cloned();
    let fresh = s.ctx().salt.fresh(now);
    let w = s.ctx().rules.load().resolve(&key).write.idempotency;
    let once = idem::Once {
        key,
        delta,
        id,
        window_ms: w.window_ms,
        max_ids: w.max_ids,
    };
    match idem::plan(&s.ctx().backend, entry.as_deref(), &once, now, fresh) {
        Err(e) => rb
            .slots
            .push(Slot::Ready(err_bytes(&format!("ERR saltshaker: {e}")))),
        Ok(idem::Plan::Inline { node, cmd, to }) => {
            let part = push(s, rb, node, cmd);
            rb.slots.push(Slot::Merge(Box::new(Merge::Once {
                part,
                entry,
                to,
                delta,
                salt: s.ctx().salt.clone(),
            })));
        }
        Ok(idem::Plan::Task) => {
            let (ctx, proto) = (s.ctx().clone(), s.proto());
            later(s, rb, async move {
                idem::incr(&ctx.backend, &ctx.salt, entry, once, now, fresh)
                    .await
                    .to_bytes(proto)
            });
        }
    }
}

/// Whether `SALTSHAKER.INCRBY` of `req` runs as a task (the round built so far goes first).
pub(in crate::proxy) fn idempotent_is_task(s: &Session, req: &Request) -> bool {
    let key = req.arg(1);
    let Some(e) = s.ctx().salt.table.load().get(key).cloned() else {
        return false;
    };
    let now = now_ms();
    let w = s.ctx().rules.load().resolve(key).write.idempotency;
    let fresh = s.ctx().salt.fresh(now);
    !matches!(
        idem::places(Some(&e.rec), req.arg(3), now, fresh, w.window_ms),
        Ok((_, None)) | Err(_)
    )
}

/// A display-tier read: the rollup at once when fresh, else the refresh on its way, else
/// a merge by this session that refreshes it.
fn display(
    s: &mut Session,
    e: Arc<Salted>,
    op: Op,
    ms: u64,
    args: &[Bytes],
    rb: &mut RoundBuilder,
) {
    use crate::salt::rollup::{self, Lookup};
    let field = match &op {
        Op::HGet(f) => Some(f.clone()),
        _ => None,
    };
    let refresh = std::time::Duration::from_millis(ms);
    let proto = s.proto();
    match e
        .rollup
        .lookup(field.as_ref(), refresh, std::time::Instant::now())
    {
        Lookup::Fresh(v) => rb.slots.push(Slot::Ready(v.to_bytes(proto))),
        Lookup::Wait(rx) => later(s, rb, async move { rollup::wait(rx).await.to_bytes(proto) }),
        Lookup::Refresh(t) => {
            s.ctx().salt.metrics.display_refreshes.inc();
            let (ctx, args) = (s.ctx().clone(), args.to_vec());
            later(s, rb, async move {
                let cmds = merge::plan_parts(&e, &op, &args, true);
                let merged = merge::careful_read(&ctx.backend, &e, &op, &cmds).await;
                e.rollup.done(t, merged).to_bytes(proto)
            });
        }
        Lookup::Exact => {
            let ctx = s.ctx().clone();
            let args = args.to_vec();
            later(s, rb, async move {
                merge::careful(&ctx.backend, &e, op, &args)
                    .await
                    .to_bytes(proto)
            });
        }
    }
}

/// Answers the command with a task that starts once everything the session sent before
/// has landed (its barrier: combined writes, earlier tasks, the last round's replies); the
/// session's later jobs and tasks wait for it in turn, through the same barrier.
fn later<F>(s: &mut Session, rb: &mut RoundBuilder, work: F)
where
    F: std::future::Future<Output = Bytes> + Send + 'static,
{
    // A combined write after this task waits for it too (through `last_ack`, as for the
    // last round): it must not reach the node before a read that came before it.
    let (prior, done_tx, then_tx) = s.order.task();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        for p in prior {
            let _ = p.await;
        }
        let _ = tx.send(work.await);
        let _ = done_tx.send(());
        let _ = then_tx.send(());
    });
    rb.slots.push(Slot::Later(rx));
}
