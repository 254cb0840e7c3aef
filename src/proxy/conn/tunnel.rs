//! Pub/sub: once a client subscribes, its connection becomes a tunnel to the pub/sub node.
//!
//! Over a pool, every channel lives on the first node (PUBLISH goes there too), so a
//! message published through any proxy reaches every subscriber. The tunnel takes a
//! connection of its own in the client's protocol (one the node's worker opened ahead,
//! `open_now`, else a new one), forwards the SUBSCRIBE and everything the client sends
//! after it, and copies the node's bytes back until either side closes. On the way it
//! reads the subscriptions' confirmations and the client's commands for CLIENT LIST
//! (`sub`, `psub`, `ssub`, the `P` flag, `cmd`).
//! Replies to commands sent before SUBSCRIBE are written first: the writer hands over the
//! client's write half only after the round that holds SUBSCRIBE.
//!
//! A subscribed client can be where another client's CLIENT TRACKING invalidations go
//! (REDIRECT): they are written between the node's whole replies, as Redis writes them to
//! a subscriber of `__redis__:invalidate` (RESP2) or as pushes (RESP3).

use crate::net::{ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::proxy::registry::clients::Client;
use std::sync::Arc;

use crate::backend::{BackendError, Dedicated, Handshake, Node};
use crate::resp::{
    encode_command, parse_value, Limits, Proto, ReplyFramer, Request, RequestParser, Value,
};

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
    /// Replies of the proxy's own commands at the start (CLIENT SETNAME), not passed on.
    skip: usize,
}

/// A tunnel on the connection `node` opened ahead (`Node::take_spare`), with the SUBSCRIBE
/// (`first`) written at once, in the step that read it: None when no connection waits.
/// For a client in database 0 with nothing read before it still to send: a PUBLISH that
/// another client sends right after the SUBSCRIBE then finds the subscription in place,
/// as it would directly. A name the client gave itself is set first, its reply not
/// passed on.
pub fn open_now(
    node: &Arc<Node>,
    proto: Proto,
    name: Option<&Bytes>,
    first: Bytes,
) -> Option<Start> {
    let spare = node.take_spare(proto)?;
    let (wires, skip) = first_wires(name, first);
    let max_bulk = spare.max_reply_bulk();
    let (stream, leftover) = spare.into_parts();
    // What the socket does not take now (over TLS, all of it) the pump writes first.
    let mut pending = Vec::new();
    for w in wires {
        if !pending.is_empty() {
            pending.push(w);
            continue;
        }
        match stream.try_write(&w) {
            Ok(n) if n == w.len() => {}
            Ok(n) => pending.push(w.slice(n..)),
            Err(_) => pending.push(w),
        }
    }
    node.warm_spare(proto);
    Some(start(stream, leftover, pending, skip, proto, max_bulk))
}

/// What a tunnel sends first: CLIENT SETNAME when it takes a connection opened ahead for a
/// client that named itself (its reply is skipped: the count), then the SUBSCRIBE.
fn first_wires(name: Option<&Bytes>, first: Bytes) -> (Vec<Bytes>, usize) {
    let mut wires = Vec::with_capacity(2);
    if let Some(name) = name {
        let mut setname = BytesMut::new();
        encode_command(&[b"CLIENT".as_slice(), b"SETNAME", name], &mut setname);
        wires.push(setname.freeze());
    }
    let skip = wires.len();
    wires.push(first);
    (wires, skip)
}

fn start(
    stream: crate::net::Stream,
    leftover: BytesMut,
    pending: Vec<Bytes>,
    skip: usize,
    proto: Proto,
    max_bulk: usize,
) -> Start {
    let (backend_r, backend_w) = stream.into_split();
    Start {
        backend_w,
        pending,
        end: Some(TunnelEnd {
            backend_r,
            leftover,
            skip,
        }),
        proto,
        max_bulk,
    }
}

/// Opens a tunnel to `node` on a connection made with `hs`; `first` (the SUBSCRIBE) is
/// the first thing sent on it. A connection the node opened ahead (`Node::take_spare`)
/// is taken when the client is in database 0, so the SUBSCRIBE leaves at once; a name
/// the client gave itself is then set on it first, its reply not passed on.
///
/// `now`: nothing the session read before the SUBSCRIBE is still to be sent, so it is
/// written to the node here, at once, rather than when the writer hands over the client's
/// connection: a PUBLISH another client sends right after it then finds the subscription
/// in place, as it would directly.
pub async fn open(
    node: &Arc<Node>,
    hs: &Handshake,
    first: Bytes,
    now: bool,
) -> Result<Start, BackendError> {
    let spare = (hs.db == 0).then(|| node.take_spare(hs.proto)).flatten();
    node.warm_spare(hs.proto);
    let (conn, (mut pending, skip)) = match spare {
        Some(d) => (d, first_wires(hs.name.as_ref(), first)),
        // A new connection sets the name in its handshake.
        None => (Dedicated::open(hs).await?, (vec![first], 0)),
    };
    let (mut stream, leftover) = conn.into_parts();
    if now {
        for p in pending.drain(..) {
            stream
                .write_all(&p)
                .await
                .map_err(|e| BackendError::io(&hs.addr, e))?;
        }
        stream
            .flush()
            .await
            .map_err(|e| BackendError::io(&hs.addr, e))?;
    }
    Ok(start(
        stream,
        leftover,
        pending,
        skip,
        hs.proto,
        hs.max_reply_bulk,
    ))
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
        mut skip,
    } = end;
    let up = async {
        // The client's bytes go on as they come; a copy is parsed only to show the last
        // command in CLIENT LIST (`cmd=unsubscribe`), which tools wait for.
        let mut names = Names::new();
        for p in pending {
            names.feed(&p, me);
            backend_w.write_all(&p).await?;
        }
        backend_w.flush().await?;
        let mut chunk = BytesMut::with_capacity(16 * 1024);
        loop {
            chunk.clear();
            if client_r.read_buf(&mut chunk).await? == 0 {
                break;
            }
            names.feed(&chunk, me);
            backend_w.write_all(&chunk).await?;
        }
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
                    // The first replies are the skipped ones, so `whole` is 0 here.
                    Ok(Some(n)) if skip > 0 => {
                        let _ = buf.split_to(whole + n);
                        skip -= 1;
                    }
                    Ok(Some(n)) => {
                        confirmed(&buf[whole..whole + n], me);
                        whole += n;
                    }
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

/// The commands a subscribed client sends, parsed from a copy of its bytes for CLIENT
/// LIST's `cmd=`. A client that sends what does not parse is passed on all the same; its
/// commands are no longer shown.
struct Names {
    parser: RequestParser,
    buf: BytesMut,
    reqs: Vec<Request>,
    broken: bool,
}

impl Names {
    fn new() -> Names {
        Names {
            parser: RequestParser::new(Limits::default()),
            buf: BytesMut::new(),
            reqs: Vec::new(),
            broken: false,
        }
    }

    fn feed(&mut self, bytes: &[u8], me: &Client) {
        if self.broken {
            return;
        }
        self.buf.extend_from_slice(bytes);
        if self.parser.parse(&mut self.buf, &mut self.reqs).is_err() {
            self.broken = true;
            self.buf = BytesMut::new();
        }
        if let Some(c) = self
            .reqs
            .iter()
            .rev()
            .find_map(|r| crate::command::classify(r).ok())
        {
            me.touched(std::time::Instant::now(), self.buf.capacity(), c.spec);
        }
        self.reqs.clear();
    }
}

/// A reply from the node: a subscription's confirmation (`subscribe`, `unsubscribe`, ...
/// with its count) updates what CLIENT LIST shows of the client.
fn confirmed(reply: &[u8], me: &Client) {
    // Confirmations are arrays (RESP2) or pushes (RESP3) of three; a message is too, but
    // its kind is `message`, `pmessage` or `smessage`, which `set_subs` ignores.
    let head = &reply[..reply.len().min(24)];
    if !matches!(reply.first(), Some(b'*' | b'>'))
        || reply.len() > 1024
        || !head.windows(8).any(|w| w.eq_ignore_ascii_case(b"ubscribe"))
    {
        return;
    }
    if let Ok(Some((Value::Array(items) | Value::Push(items), _))) = parse_value(reply) {
        if let [Value::Bulk(kind), _, Value::Integer(n)] = items.as_slice() {
            me.set_subs(kind, (*n).clamp(0, u32::MAX as i64) as u32);
        }
    }
}
