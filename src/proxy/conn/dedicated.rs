//! A session's own backend connection, for commands that must not share one: blocking
//! commands (BLPOP holds its connection) and WATCH (the watch lives on the connection).
//!
//! A worker task owns the connection and runs calls one at a time, in the order the
//! session made them. It stops when the session goes away, even mid-BLPOP, so an
//! abandoned blocking command never pins a backend connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot, watch};

use crate::backend::{Dedicated, Handshake};
use crate::resp::encode_error;

type Call = (Vec<Bytes>, usize, oneshot::Sender<Bytes>);

pub struct DedicatedWorker {
    tx: mpsc::UnboundedSender<Call>,
    /// The node's id of the connection (CLIENT ID), once open; 0 before, or when not
    /// asked for.
    node_id: Arc<AtomicU64>,
}

/// CLIENT ID, asked on a blocking worker's connection when it opens, so that CLIENT
/// UNBLOCK can name it to the node.
const CLIENT_ID: &[u8] = b"*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n";

impl DedicatedWorker {
    /// `ask_id`: learn the node's id of the connection when it opens (blocking commands).
    pub fn spawn(hs: Handshake, gone: watch::Receiver<bool>, ask_id: bool) -> DedicatedWorker {
        let (tx, rx) = mpsc::unbounded_channel();
        let node_id = Arc::new(AtomicU64::new(0));
        tokio::spawn(work(hs, rx, gone, ask_id.then(|| node_id.clone())));
        DedicatedWorker { tx, node_id }
    }

    /// The node's id of the connection (0 until known).
    pub fn node_id(&self) -> Arc<AtomicU64> {
        self.node_id.clone()
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
    node_id: Option<Arc<AtomicU64>>,
) {
    let mut conn: Option<Dedicated> = None;
    while let Some((wires, count, reply)) = rx.recv().await {
        if conn.is_none() {
            match Dedicated::open(&hs).await {
                Ok(mut c) => {
                    if let Some(id) = &node_id {
                        id.store(0, Ordering::Release);
                        let asked = c
                            .call_within(
                                &[Bytes::from_static(CLIENT_ID)],
                                1,
                                crate::backend::ASK_WITHIN,
                            )
                            .await;
                        match asked {
                            Ok(r) => {
                                let b = r.get(0);
                                if let Some(n) = b
                                    .strip_prefix(b":")
                                    .and_then(|x| x.strip_suffix(b"\r\n"))
                                    .and_then(crate::resp::parse_i64)
                                {
                                    id.store(n as u64, Ordering::Release);
                                }
                            }
                            // Silent or gone: this connection is out of step; the next
                            // call opens another.
                            Err(e) => {
                                let _ = reply.send(error(&format!("ERR saltshaker: {e}")));
                                continue;
                            }
                        }
                    }
                    conn = Some(c)
                }
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
