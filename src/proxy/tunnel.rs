//! Pub/sub: once a client subscribes, its connection becomes a tunnel to the pub/sub node.
//!
//! Over a pool, every channel lives on the first node (PUBLISH goes there too), so a
//! message published through any proxy reaches every subscriber. The tunnel opens a
//! dedicated connection in the client's protocol, forwards the SUBSCRIBE and everything
//! the client sends after it, and copies the node's bytes back until either side closes.
//! Replies to commands sent before SUBSCRIBE are written first: the writer hands over the
//! client's write half only after the round that holds SUBSCRIBE.

use crate::net::{ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::{BackendError, Dedicated, Handshake};

/// The reader's end: the node's write half and what still has to be sent to it.
pub struct Start {
    backend_w: WriteHalf,
    pub pending: Vec<Bytes>,
    end: Option<TunnelEnd>,
}

impl Start {
    pub fn take_end(&mut self) -> Option<TunnelEnd> {
        self.end.take()
    }
}

/// The writer's end: the node's read half and bytes it already sent.
pub struct TunnelEnd {
    backend_r: ReadHalf,
    leftover: BytesMut,
}

/// Opens a tunnel on a dedicated connection made with `hs`; `first` (the SUBSCRIBE) is
/// the first thing sent on it.
pub async fn open(hs: &Handshake, first: Bytes) -> Result<Start, BackendError> {
    let (stream, leftover) = Dedicated::open(hs).await?.into_parts();
    let (backend_r, backend_w) = stream.into_split();
    Ok(Start {
        backend_w,
        pending: vec![first],
        end: Some(TunnelEnd {
            backend_r,
            leftover,
        }),
    })
}

/// Copies both ways until either side closes.
pub async fn pump(mut client_r: ReadHalf, mut client_w: WriteHalf, start: Start, end: TunnelEnd) {
    let Start {
        mut backend_w,
        pending,
        ..
    } = start;
    let TunnelEnd {
        mut backend_r,
        leftover,
    } = end;
    let up = async {
        for p in pending {
            backend_w.write_all(&p).await?;
        }
        backend_w.flush().await?;
        tokio::io::copy(&mut client_r, &mut backend_w).await?;
        backend_w.shutdown().await
    };
    let down = async {
        client_w.write_all(&leftover).await?;
        client_w.flush().await?;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = backend_r.read(&mut buf).await?;
            if n == 0 {
                return client_w.shutdown().await;
            }
            client_w.write_all(&buf[..n]).await?;
            client_w.flush().await?;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
