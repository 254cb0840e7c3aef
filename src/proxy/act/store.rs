//! A command that stores its result (SUNIONSTORE, ZRANGESTORE, GEOSEARCHSTORE, GEORADIUS
//! ... STORE, BITOP, COPY, ...) over a pool whose sources share a node but whose
//! destination is on another: the source node runs the command into a temporary key of
//! its own, and the result moves to the destination's node with DUMP and RESTORE.
//!
//! On the source node, in one pipeline: the command with the temporary key in the
//! destination's place, a one-minute expiry on it (so a proxy that dies here leaves
//! nothing behind for long), DUMP, DEL. Then on the destination's node: RESTORE ...
//! REPLACE, or DEL when the result is empty (as the command itself deletes an empty
//! result's destination); COPY restores without REPLACE unless it was asked, and answers 0
//! when the destination exists, as COPY does. The reply is the command's own. Ordered
//! with the session's other commands as SORT across nodes is (`sort`); not atomic across
//! the two nodes.

use bytes::Bytes;
use smallvec::smallvec;
use tokio::time::Instant;

use crate::backend::ConnHandle;
use crate::command::Classified;
use crate::command::Cmd;
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{parse_value, Request, Value};

/// Where the destination is among a storing command's keys: first or last.
pub(in crate::proxy) fn destination(c: &Classified) -> Option<usize> {
    match c.spec.cmd {
        Cmd::Sunionstore
        | Cmd::Sinterstore
        | Cmd::Sdiffstore
        | Cmd::Zunionstore
        | Cmd::Zinterstore
        | Cmd::Zdiffstore
        | Cmd::Zrangestore
        | Cmd::Geosearchstore
        | Cmd::Bitop => Some(0),
        Cmd::Georadius | Cmd::Georadiusbymember | Cmd::Copy if c.keys.len() == 2 => Some(1),
        _ => None,
    }
}

/// A key name of this proxy's on `node`: a fresh random prefix, then a counter until the
/// placement puts it there (a few tries: one in `nodes` lands on each).
fn temp_key(s: &Session, node: usize) -> Option<Bytes> {
    let mut raw = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).ok()?;
    let nonce = u64::from_le_bytes(raw);
    (0..10_000u32)
        .map(|i| format!("saltshaker:store:{nonce:016x}:{i}"))
        .find(|k| s.ctx().backend.node_for(k.as_bytes()) == node)
        .map(Bytes::from)
}

/// Runs the command across the two nodes (see the module doc); the reply comes from a task.
pub(in crate::proxy) fn across(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    dest: usize,
    rb: &mut RoundBuilder,
) {
    let dst_arg = c.keys[dest] as usize;
    let b = &s.ctx().backend;
    let Some(src_arg) = c.keys.iter().find(|&&k| k as usize != dst_arg) else {
        return rb
            .slots
            .push(Slot::Ready(err_bytes("ERR saltshaker: no source key")));
    };
    let src_node = b.node_for(req.arg(*src_arg as usize));
    let dst = req.arg_bytes(dst_arg);
    let dst_node = b.node_for(&dst);
    let Some(tmp) = temp_key(s, src_node) else {
        return rb.slots.push(Slot::Ready(err_bytes(
            "ERR saltshaker: no temporary key name for the source node",
        )));
    };
    let mut args: Vec<Bytes> = (0..req.argc()).map(|i| req.arg_bytes(i)).collect();
    args[dst_arg] = tmp.clone();
    let copy = c.spec.cmd == Cmd::Copy;
    let replace = !copy || (3..req.argc()).any(|i| req.arg(i).eq_ignore_ascii_case(b"REPLACE"));
    let src = s.conn(src_node);
    let to = s.conn(dst_node);
    let deadline = s.ctx().backend.request_timeout.map(|t| Instant::now() + t);
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let reply = run(&src, &to, &args, &tmp, &dst, copy, replace, deadline)
            .await
            .unwrap_or_else(|e| e);
        let _ = tx.send(reply);
    });
    rb.slots.push(Slot::Later(rx));
    s.settle_next();
}

#[allow(clippy::too_many_arguments)]
async fn run(
    src: &ConnHandle,
    to: &ConnHandle,
    args: &[Bytes],
    tmp: &Bytes,
    dst: &Bytes,
    copy: bool,
    replace: bool,
    deadline: Option<Instant>,
) -> Result<Bytes, Bytes> {
    let w = |a: &[&[u8]]| crate::backend::wire(a);
    let failed = |e: crate::backend::BackendError| err_bytes(&format!("ERR saltshaker: {e}"));
    let data = smallvec![
        crate::backend::wire(args),
        w(&[b"PEXPIRE", tmp, b"60000"]),
        w(&[b"DUMP", tmp]),
        w(&[b"DEL", tmp]),
    ];
    let r = src.call(data, 4, deadline).await.map_err(failed)?;
    let reply = r.get(0);
    if reply.starts_with(b"-") {
        return Err(reply);
    }
    let payload = match parse_value(&r.get(2)) {
        Ok(Some((Value::Bulk(p), _))) => Some(p),
        Ok(Some((Value::Nil, _))) => None,
        _ => return Err(err_bytes("ERR saltshaker: unexpected DUMP reply")),
    };
    let cmd = match (&payload, copy) {
        // COPY of a missing source: nothing to do, as COPY does nothing.
        (None, true) => return Ok(reply),
        (None, false) => w(&[b"DEL", dst]),
        (Some(p), _) if replace => w(&[b"RESTORE", dst, b"0", p, b"REPLACE"]),
        (Some(p), _) => w(&[b"RESTORE", dst, b"0", p]),
    };
    let done = to.call(smallvec![cmd], 1, deadline).await.map_err(failed)?;
    let done = done.get(0);
    if done.starts_with(b"-BUSYKEY") && copy {
        return Ok(Bytes::from_static(b":0\r\n"));
    }
    if done.starts_with(b"-") {
        return Err(done);
    }
    Ok(reply)
}
