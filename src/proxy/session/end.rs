//! How a connection's read phase ends (`End`), and what follows it: the pub/sub tunnel,
//! the MONITOR stream, or a polite close that lets every reply reach the client.

use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::net::{ReadHalf, WriteHalf};
use crate::proxy::conn::tunnel;

/// After the read phase: hand over to the pub/sub tunnel, or close politely.
pub async fn close(
    end: End,
    writer: tokio::task::JoinHandle<(WriteHalf, Option<tunnel::TunnelEnd>)>,
    mut killed: watch::Receiver<bool>,
    me: std::sync::Arc<crate::proxy::registry::clients::Client>,
) {
    let (mut w, tunnel_end): (WriteHalf, _) = match writer.await {
        Ok(x) => x,
        Err(_) => return,
    };
    match (end, tunnel_end) {
        // A tunnel or a monitor ends when either side closes, or when CLIENT KILL chooses
        // the connection (dropping the pump closes its sockets).
        (End::Tunnel(r, start), Some(t)) => tokio::select! {
            _ = tunnel::pump(r, w, start, t, &me) => {}
            _ = killed.wait_for(|k| *k) => {}
        },
        (End::Monitor(r, lines), None) => tokio::select! {
            _ = crate::proxy::registry::monitor::pump(r, w, lines) => {}
            _ = killed.wait_for(|k| *k) => {}
        },
        (End::Drained(mut r), _) => {
            // Every command read has its reply written. Send FIN, then discard what the
            // client sent after we stopped reading (it was never executed, so the client can
            // retry it elsewhere) instead of resetting the connection, which could destroy
            // replies still in flight to the client.
            use tokio::io::AsyncWriteExt;
            let _ = w.shutdown().await;
            let mut sink = vec![0u8; 4096];
            let linger = tokio::time::sleep(std::time::Duration::from_secs(2));
            tokio::pin!(linger);
            loop {
                tokio::select! {
                    _ = &mut linger => break,
                    n = r.read(&mut sink) => if matches!(n, Ok(0) | Err(_)) { break },
                }
            }
        }
        _ => {}
    }
}

/// How the read phase ended.
pub enum End {
    Closed,
    /// Shutdown: every complete command read was dispatched; close politely.
    Drained(ReadHalf),
    Tunnel(ReadHalf, tunnel::Start),
    /// MONITOR: the lines to stream once the replies before it are written.
    Monitor(ReadHalf, tokio::sync::mpsc::Receiver<bytes::Bytes>),
}
