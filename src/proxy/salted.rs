//! The session's side of salting: a command that names a salted key is answered by a task
//! (shard write, or merged read) that runs after this session's earlier commands have
//! landed, and before its later ones leave (the session barrier), so a client reads its
//! own writes exactly as on one key. A command that cannot be merged first moves the
//! shards into the base key, then goes on as usual.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::round::{RoundBuilder, Slot};
use super::session::{err_bytes, Session};
use crate::command::Classified;
use crate::resp::Request;
use crate::rules::Strategy;
use crate::salt::ops::{self, Op};
use crate::salt::{fold, now_ms, SaltTable};

/// The salt table, when this command names a salted key (database 0 only: the registry
/// speaks of database 0's keys).
pub(super) fn touched(s: &Session, req: &Request, c: &Classified) -> Option<Arc<SaltTable>> {
    if s.db != 0 || c.keys.is_empty() {
        return None;
    }
    let table = s.ctx.salt.table.load();
    if table.is_empty()
        || !c
            .keys
            .iter()
            .any(|&k| table.get(req.arg(k as usize)).is_some())
    {
        return None;
    }
    Some(table.clone())
}

/// What the session does next.
pub(super) enum Next {
    /// Answered (by a task, or with an error).
    Done,
    /// Go on with the usual path (the key's shards are folded in if that was needed).
    Forward,
}

pub(super) async fn act(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    table: Arc<SaltTable>,
    rb: &mut RoundBuilder,
) -> Next {
    let args: Vec<Bytes> = (0..req.argc()).map(|i| req.arg_bytes(i)).collect();
    let name = c.spec.name;
    if s.tx.is_none() && c.keys.len() == 1 {
        let e = table.get(req.arg(c.keys[0] as usize)).cloned();
        if let Some(e) = e {
            match ops::classify(name, &args) {
                Op::Other => {}
                Op::Write { .. }
                    if e.write_shard(now_ms()).is_none() || !s.ctx.salt.fresh(now_ms()) =>
                {
                    // Promotion not in force yet, or demoted: the base key takes writes.
                    return Next::Forward;
                }
                op => {
                    let combine = combine_with(s, &e.key);
                    let ctx = s.ctx.clone();
                    let proto = s.proto;
                    later(s, rb, async move {
                        ops::run(
                            &ctx.backend,
                            &e,
                            op,
                            &args,
                            proto,
                            combine,
                            &ctx.salt.metrics,
                        )
                        .await
                    });
                    return Next::Done;
                }
            }
        }
    } else if s.tx.is_none() && matches!(name, "MGET" | "DEL" | "UNLINK" | "EXISTS" | "TOUCH") {
        let ctx = s.ctx.clone();
        let proto = s.proto;
        later(s, rb, async move {
            ops::multi(&ctx.backend, &table, &args, name, proto, &ctx.salt.metrics).await
        });
        return Next::Done;
    }
    // Not mergeable (or inside MULTI): fold the shards into the base key, then run it.
    for d in s.barrier.drain(..) {
        let _ = d.await;
    }
    for &k in &c.keys {
        let key = req.arg(k as usize);
        if table.get(key).is_none() {
            continue;
        }
        if let Err(e) = fold::move_all(&s.ctx.backend, &s.ctx.salt, key).await {
            tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, command = name, "could not fold a salted key before a command that needs its whole value");
            if let Some(tx) = s.tx.as_mut() {
                tx.dirty = true;
            }
            rb.slots.push(Slot::Ready(err_bytes(&format!(
                "ERR saltshaker: {name} needs the salted key folded first, and that failed: {e}"
            ))));
            return Next::Done;
        }
    }
    Next::Forward
}

/// salt+combine (and auto, once it salts) combine the writes of each shard.
fn combine_with(s: &Session, key: &[u8]) -> ops::CombineWith {
    let w = s.ctx.rules.load().resolve(key).write;
    matches!(w.strategy, Strategy::SaltCombine | Strategy::Auto).then(|| {
        (
            s.ctx.combiner.clone(),
            std::time::Duration::from_micros(w.combine.window_us),
        )
    })
}

/// Answers the command with a task that starts once this session's earlier writes have
/// landed; the session's later commands wait for it in turn.
fn later<F>(s: &mut Session, rb: &mut RoundBuilder, work: F)
where
    F: std::future::Future<Output = Bytes> + Send + 'static,
{
    let prior: Vec<oneshot::Receiver<()>> = s.barrier.drain(..).collect();
    let (done_tx, done_rx) = oneshot::channel();
    s.barrier.push(done_rx);
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        for p in prior {
            let _ = p.await;
        }
        let _ = tx.send(work.await);
        let _ = done_tx.send(());
    });
    rb.slots.push(Slot::Later(rx));
}
