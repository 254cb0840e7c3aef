//! A session's own backend connection, for commands that must not share one: blocking
//! commands (BLPOP holds its connection) and WATCH (the watch lives on the connection).
//!
//! A worker task owns the connection and runs calls one at a time, in the order the
//! session made them. It stops when the session goes away, even mid-BLPOP, so an
//! abandoned blocking command never pins a backend connection.

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot, watch};

use crate::backend::{Dedicated, Handshake};
use crate::resp::encode_error;

type Call = (Vec<Bytes>, usize, oneshot::Sender<Bytes>);

pub struct DedicatedWorker {
    tx: mpsc::UnboundedSender<Call>,
}

impl DedicatedWorker {
    pub fn spawn(hs: Handshake, gone: watch::Receiver<bool>) -> DedicatedWorker {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(work(hs, rx, gone));
        DedicatedWorker { tx }
    }

    /// Sends `count` commands; the receiver gets the reply of the last one.
    pub fn call(&self, wires: Vec<Bytes>, count: usize) -> oneshot::Receiver<Bytes> {
        let (tx, rx) = oneshot::channel();
        // If the worker is gone the sender drops and the writer reports the failure.
        let _ = self.tx.send((wires, count, tx));
        rx
    }
}

async fn work(
    hs: Handshake,
    mut rx: mpsc::UnboundedReceiver<Call>,
    mut gone: watch::Receiver<bool>,
) {
    let mut conn: Option<Dedicated> = None;
    while let Some((wires, count, reply)) = rx.recv().await {
        if conn.is_none() {
            match Dedicated::open(&hs).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    let _ = reply.send(error(&format!("ERR saltshaker: {e}")));
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("opened above");
        let res = tokio::select! {
            r = c.call(&wires, count) => r,
            _ = gone.wait_for(|g| *g) => return,
        };
        match res {
            Ok(r) => {
                let _ = reply.send(r.get(r.len() - 1));
            }
            Err(e) => {
                conn = None;
                let _ = reply.send(error(&format!("ERR saltshaker: {e}")));
            }
        }
    }
}

fn error(msg: &str) -> Bytes {
    let mut out = BytesMut::new();
    encode_error(msg, &mut out);
    out.freeze()
}
