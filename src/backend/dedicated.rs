//! A connection owned by one session: blocking commands, WATCH, pub/sub, and the
//! proxy's own one-off questions (the cluster map at startup). One call at a time.

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::job::Replies;
use super::{BackendError, Handshake};
use crate::net::Stream;
use crate::resp::ReplyFramer;

/// A connection owned by one session: blocking commands, WATCH, pub/sub. Not shared, so a
/// command that blocks holds up nobody else.
pub struct Dedicated {
    /// The node's address, for errors.
    node: String,
    stream: Stream,
    buf: BytesMut,
    framer: ReplyFramer,
    max_reply_bulk: usize,
}

impl Dedicated {
    pub async fn open(hs: &Handshake) -> Result<Dedicated, BackendError> {
        let stream = hs.connect().await?;
        Ok(Dedicated::from_stream(&hs.addr, stream, hs.max_reply_bulk))
    }

    pub fn from_stream(node: &str, stream: Stream, max_reply_bulk: usize) -> Dedicated {
        Dedicated {
            node: node.to_string(),
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            framer: ReplyFramer::new(max_reply_bulk),
            max_reply_bulk,
        }
    }

    /// `call`, given up after `within`: the node did not answer in time
    /// (`BackendError::Timeout` naming it). The connection is then out of step (a reply
    /// may still come) and must be dropped.
    pub async fn call_within(
        &mut self,
        data: &[Bytes],
        count: usize,
        within: std::time::Duration,
    ) -> Result<Replies, BackendError> {
        match tokio::time::timeout(within, self.call(data, count)).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::Timeout(self.node.clone())),
        }
    }

    /// Sends `data` (holding `count` commands) and returns their replies. No deadline of
    /// its own: a blocking command, or a subscription's next message, may take as long as
    /// it takes. Every other wait goes through `call_within`.
    pub async fn call(&mut self, data: &[Bytes], count: usize) -> Result<Replies, BackendError> {
        for d in data {
            self.stream
                .write_all(d)
                .await
                .map_err(|e| BackendError::io(&self.node, e))?;
        }
        self.stream
            .flush()
            .await
            .map_err(|e| BackendError::io(&self.node, e))?;
        let mut ends: SmallVec<[u32; 16]> = SmallVec::new();
        let mut pos = 0usize;
        while ends.len() < count {
            if pos < self.buf.len() {
                match self.framer.next_len(&self.buf[pos..]) {
                    Ok(Some(len)) => {
                        pos += len;
                        ends.push(pos as u32);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(BackendError::protocol(&self.node, e)),
                }
            }
            self.buf.reserve(16 * 1024);
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => {
                    return Err(BackendError::io(
                        &self.node,
                        "connection closed by the node",
                    ))
                }
                Ok(_) => {}
                Err(e) => return Err(BackendError::io(&self.node, e)),
            }
        }
        Ok(Replies {
            buf: self.buf.split_to(pos).freeze(),
            ends,
        })
    }

    /// The largest bulk reply its framer takes.
    pub fn max_reply_bulk(&self) -> usize {
        self.max_reply_bulk
    }

    /// Whether the node closed this (idle) connection: see `Stream::peer_closed`.
    pub fn peer_closed(&self) -> bool {
        self.stream.peer_closed()
    }

    /// The stream and any bytes already read past the last reply, for a pub/sub tunnel.
    pub fn into_parts(self) -> (Stream, BytesMut) {
        (self.stream, self.buf)
    }
}
