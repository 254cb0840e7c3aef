//! One connection's transaction state: the commands queued since MULTI, and the WATCH held
//! on a node's dedicated connection. Redis's rules live in its methods: a MULTI does not
//! nest; a transaction stays on one node (the watched one, else its first key's); a refused
//! command aborts the EXEC (`abort`, the one place that marks it); EXEC and DISCARD end
//! both the queue and the watch.

use bytes::Bytes;

use super::dedicated::DedicatedWorker;

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
        self.multi
            .as_ref()
            .map(|q| (q.wires.len(), q.wires.iter().map(|w| w.len()).sum()))
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
