//! One connection's transaction state: the commands queued since MULTI, and the WATCH held
//! on a node's dedicated connection. Redis's rules live in its methods: a MULTI does not
//! nest; a transaction stays on one node (the watched one, else its first key's); a refused
//! command aborts the EXEC (`abort`, the one place that marks it); EXEC and DISCARD end
//! both the queue and the watch.

use bytes::{Bytes, BytesMut};

use super::dedicated::DedicatedWorker;
use crate::resp::{ReplyFramer, Request};

/// The commands of a MULTI, queued.
pub struct Queued {
    pub wires: Vec<Bytes>,
    /// The node every keyed command of the transaction is on (None while only keyless
    /// commands are queued).
    pub node: Option<usize>,
    /// Keys the queued commands write: EXEC drops their cached replies.
    pub writes: Vec<Bytes>,
    /// A command was refused: EXEC answers EXECABORT.
    pub dirty: bool,
    /// Commands the proxy answers itself (CLIENT SETNAME, CLIENT ID, ...), run at EXEC in
    /// their turn, with their place among all the queued commands: their replies go into
    /// EXEC's reply there (`splice`).
    pub locals: Vec<(usize, Request)>,
    /// The database a queued SELECT moves the client to once EXEC has run (the SELECT
    /// itself goes to the node, so the commands after it run in that database there).
    pub select: Option<u32>,
}

/// MULTI and WATCH of one connection.
#[derive(Default)]
pub struct Txn {
    multi: Option<Queued>,
    watch: Option<(usize, DedicatedWorker)>,
}

impl Txn {
    /// Inside MULTI: commands are queued, not sent.
    pub fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

    /// A WATCH is held on some node.
    pub fn watching(&self) -> bool {
        self.watch.is_some()
    }

    /// How many commands are queued (CLIENT LIST's `multi`), and their size.
    pub fn queued(&self) -> Option<(usize, usize)> {
        self.multi.as_ref().map(|q| {
            (
                q.wires.len() + q.locals.len(),
                q.wires.iter().map(|w| w.len()).sum(),
            )
        })
    }

    /// MULTI. False when one is open already (Redis refuses to nest them).
    pub fn begin(&mut self) -> bool {
        if self.multi.is_some() {
            return false;
        }
        self.multi = Some(Queued {
            wires: Vec::new(),
            node: self.watch.as_ref().map(|w| w.0),
            writes: Vec::new(),
            dirty: false,
            locals: Vec::new(),
            select: None,
        });
        true
    }

    /// A refused command inside MULTI: the EXEC will be aborted, as on Redis. Outside MULTI
    /// it does nothing.
    pub fn abort(&mut self) {
        if let Some(q) = self.multi.as_mut() {
            q.dirty = true;
        }
    }

    /// Queues a command on `node` (None: keyless). Err(the transaction's node) when its
    /// keys are on another node than the commands queued before.
    pub fn queue(
        &mut self,
        node: Option<usize>,
        wire: Bytes,
        writes: impl IntoIterator<Item = Bytes>,
    ) -> Result<(), usize> {
        let q = self.multi.as_mut().expect("queue() inside MULTI only");
        match (q.node, node) {
            (Some(m), Some(n)) if m != n => return Err(m),
            (None, Some(n)) => q.node = Some(n),
            _ => {}
        }
        q.wires.push(wire);
        q.writes.extend(writes);
        Ok(())
    }

    /// Queues a command the proxy answers itself, run at EXEC in its turn.
    pub fn queue_local(&mut self, req: Request) {
        let q = self
            .multi
            .as_mut()
            .expect("queue_local() inside MULTI only");
        q.locals.push((q.wires.len() + q.locals.len(), req));
    }

    /// A queued SELECT of `db` (sent to the node in its turn): the client is in `db` after
    /// EXEC.
    pub fn select_after(&mut self, db: u32) {
        if let Some(q) = self.multi.as_mut() {
            q.select = Some(db);
        }
    }

    /// DISCARD: drops the queue and the watch. False without MULTI.
    pub fn discard(&mut self) -> bool {
        if self.multi.take().is_none() {
            return false;
        }
        self.watch = None;
        true
    }

    /// EXEC: the queue and the watch, both ended here. None without MULTI.
    pub fn exec(&mut self) -> Option<(Queued, Option<DedicatedWorker>)> {
        let q = self.multi.take()?;
        Some((q, self.watch.take().map(|w| w.1)))
    }

    /// WATCH on `node`: the dedicated connection that holds it, opened with `open` on
    /// first use. Err(the watched node) when keys on another node are watched already.
    pub fn watch(
        &mut self,
        node: usize,
        open: impl FnOnce() -> DedicatedWorker,
    ) -> Result<&DedicatedWorker, usize> {
        match &self.watch {
            Some((w, _)) if *w != node => return Err(*w),
            Some(_) => {}
            None => self.watch = Some((node, open())),
        }
        Ok(&self.watch.as_ref().expect("set above").1)
    }

    /// UNWATCH: the connection that held the watch, if any.
    pub fn unwatch(&mut self) -> Option<DedicatedWorker> {
        self.watch.take().map(|w| w.1)
    }

    /// RESET: no transaction, no watch.
    pub fn reset(&mut self) {
        *self = Txn::default();
    }

    /// A change of protocol or database: the watch's connection was opened for the old
    /// ones, so it goes (the queue, if any, stays).
    pub fn forget_watch(&mut self) {
        self.watch = None;
    }
}

/// EXEC's reply from the node with the replies of the commands the proxy ran itself put in
/// their places (`Queued::locals`). A reply that is not an array (EXEC's nil when a watched
/// key changed, an error) is returned as it is.
pub fn splice(exec: Bytes, locals: &[(usize, Bytes)]) -> Bytes {
    if locals.is_empty() || exec.first() != Some(&b'*') {
        return exec;
    }
    let Some(end) = exec.iter().position(|&b| b == b'\n') else {
        return exec;
    };
    let Some(n) = std::str::from_utf8(&exec[1..end.saturating_sub(1)])
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return exec;
    };
    let mut out = BytesMut::with_capacity(exec.len() + 64);
    out.extend_from_slice(format!("*{}\r\n", n + locals.len()).as_bytes());
    let mut framer = ReplyFramer::new(usize::MAX);
    let (mut at, mut from_node, mut local) = (end + 1, 0, locals.iter().peekable());
    for place in 0..n + locals.len() {
        if let Some((_, b)) = local.next_if(|(p, _)| *p == place) {
            out.extend_from_slice(b);
            continue;
        }
        if from_node == n {
            break;
        }
        match framer.next_len(&exec[at..]) {
            Ok(Some(len)) => {
                out.extend_from_slice(&exec[at..at + len]);
                at += len;
                from_node += 1;
            }
            _ => return exec,
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxys_own_replies_go_into_execs_reply_in_their_places() {
        let exec = Bytes::from_static(b"*2\r\n+OK\r\n$1\r\nx\r\n");
        let locals = [
            (0, Bytes::from_static(b":7\r\n")),
            (2, Bytes::from_static(b"+OK\r\n")),
            (4, Bytes::from_static(b"$2\r\nnm\r\n")),
        ];
        assert_eq!(
            &splice(exec, &locals)[..],
            b"*5\r\n:7\r\n+OK\r\n+OK\r\n$1\r\nx\r\n$2\r\nnm\r\n"
        );
        // A transaction that a changed watched key aborted keeps its nil.
        let nil = Bytes::from_static(b"*-1\r\n");
        assert_eq!(&splice(nil.clone(), &locals)[..], &nil[..]);
        let abort = Bytes::from_static(b"-EXECABORT x\r\n");
        assert_eq!(&splice(abort.clone(), &locals)[..], &abort[..]);
    }
}
