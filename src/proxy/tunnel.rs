//! Pub/sub: once a client subscribes, its connection becomes a tunnel to the pub/sub node.
//!
//! Over a pool, every channel lives on the first node (PUBLISH goes there too), so a
//! message published through any proxy reaches every subscriber. The tunnel opens a
//! dedicated connection in the client's protocol, forwards the SUBSCRIBE and everything
//! the client sends after it, and copies the node's bytes back until either side closes.
//! Replies to commands sent before SUBSCRIBE are written first: the writer hands over the
//! client's write half only after the round that holds SUBSCRIBE.
//!
//! A subscribed client can be where another client's CLIENT TRACKING invalidations go
//! (REDIRECT): they are written between the node's whole replies, as Redis writes them to
//! a subscriber of `__redis__:invalidate` (RESP2) or as pushes (RESP3).

use crate::net::{ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::clients::Client;
use crate::backend::{BackendError, Dedicated, Handshake};
use crate::resp::{Proto, ReplyFramer};

/// The reader's end: the node's write half and what still has to be sent to it.
pub struct Start {
    backend_w: WriteHalf,
    pub pending: Vec<Bytes>,
    end: Option<TunnelEnd>,
    proto: Proto,
    max_bulk: usize,
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
        proto: hs.proto,
        max_bulk: hs.max_reply_bulk,
    })
}

/// Copies both ways until either side closes; `me`'s invalidations go between the node's
/// replies.
pub async fn pump(
    mut client_r: ReadHalf,
    mut client_w: WriteHalf,
    start: Start,
    end: TunnelEnd,
    me: &Client,
) {
    let Start {
        mut backend_w,
        pending,
        proto,
        max_bulk,
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
        // The node's bytes go on in whole replies (`whole`), so that an invalidation can be
        // written between two of them.
        let mut buf = leftover;
        let mut framer = ReplyFramer::new(max_bulk);
        let mut whole = 0;
        loop {
            while whole < buf.len() {
                match framer.next_len(&buf[whole..]) {
                    Ok(Some(n)) => whole += n,
                    Ok(None) => break,
                    // Not RESP as we know it: pass it on as it is.
                    Err(_) => whole = buf.len(),
                }
            }
            if whole > 0 {
                client_w.write_all(&buf.split_to(whole)).await?;
                whole = 0;
            }
            if let Some(m) = me.inbox.take(proto == Proto::Resp3) {
                client_w.write_all(&m).await?;
            }
            client_w.flush().await?;
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(16 * 1024);
            }
            tokio::select! {
                n = backend_r.read_buf(&mut buf) => {
                    if n? == 0 {
                        return client_w.shutdown().await;
                    }
                }
                _ = me.inbox.notify.notified() => {}
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
