//! Redis client-side-caching invalidations for the read cache: one `Tracker` per node.
//!
//! The tracker is a dedicated RESP2 connection subscribed to `__redis__:invalidate`. The
//! connection that fills the cache (a `Filler`) turns tracking on with `REDIRECT <tracker's
//! client id>`, so every key read through it is remembered by Redis, and any later write to
//! it, from anywhere (another proxy, redis-cli, a Lua script, expiry, eviction), sends the
//! key's name to the tracker. A nil payload means the node flushed everything.
//!
//! When the tracker's connection is lost, invalidations are lost with it: the tracker first
//! reports `All` (drop every cached key of the node), and its client id reads `None` until
//! it is back. It comes back with a new id, so the filler must be rebuilt: `Filler` does
//! that, and hands out its connection only while its redirect id is the tracker's current
//! id, which keeps the cache from being filled through a connection whose invalidations go
//! nowhere.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{wire, BackendError, ConnHandle, Dedicated, Handshake, NodeMetrics};
use crate::resp::{parse_value, Proto, ReplyFramer, Value};

/// Channel Redis publishes invalidations to in RESP2 redirect mode.
const CHANNEL: &[u8] = b"__redis__:invalidate";
/// A silent tracker connection is pinged this often, and declared lost after `DEAD_AFTER`
/// without a byte: a half-open connection would otherwise lose invalidations unnoticed.
const PING_EVERY: Duration = Duration::from_secs(1);
const DEAD_AFTER: Duration = Duration::from_secs(3);

/// What Redis said changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// These keys were written (or expired, or evicted).
    Keys(Vec<Bytes>),
    /// Everything: the node was flushed, or the tracking connection was lost.
    All,
}

/// The invalidation subscriber of one node. Dropping it stops it.
pub struct Tracker {
    ids: watch::Receiver<Option<u64>>,
    on_event: Callback,
    task: JoinHandle<()>,
}

type Callback = Arc<dyn Fn(Invalidation) + Send + Sync>;

impl Tracker {
    /// Starts tracking the node `hs` reaches; `on_event` runs on the tracker's task for each
    /// invalidation, so it must be quick (cache removals are).
    pub fn spawn(
        hs: &Handshake,
        on_event: impl Fn(Invalidation) + Send + Sync + 'static,
    ) -> Tracker {
        let on_event: Callback = Arc::new(on_event);
        let hs = Handshake {
            proto: Proto::Resp2,
            db: 0,
            tracking_redirect: None,
            tracking_bcast: false,
            ..hs.clone()
        };
        let (tx, ids) = watch::channel(None);
        let task = tokio::spawn(run(hs, tx, on_event.clone()));
        Tracker {
            ids,
            on_event,
            task,
        }
    }

    /// The client id fill connections redirect to; None while the tracker is down.
    pub fn client_id(&self) -> Option<u64> {
        *self.ids.borrow()
    }

    /// The client id as it changes (None while down, a new id after each reconnect).
    pub fn ids(&self) -> watch::Receiver<Option<u64>> {
        self.ids.clone()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(hs: Handshake, tx: watch::Sender<Option<u64>>, on_event: Callback) {
    let min = Duration::from_millis(hs.reconnect_min_ms.max(1));
    let max = Duration::from_millis(hs.reconnect_max_ms.max(hs.reconnect_min_ms).max(1));
    let mut backoff = min;
    loop {
        let e = subscribe_and_listen(&hs, &tx, &*on_event, &mut backoff, min).await;
        if tx.send_replace(None).is_some() {
            // Report the loss before anything else: what changed meanwhile is unknown.
            on_event(Invalidation::All);
            tracing::warn!(node = %hs.addr, error = %e, "cache invalidation tracking lost; flushing the node's cached keys");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(max);
    }
}

/// One tracker connection, until it fails.
async fn subscribe_and_listen(
    hs: &Handshake,
    tx: &watch::Sender<Option<u64>>,
    on_event: &(dyn Fn(Invalidation) + Send + Sync),
    backoff: &mut Duration,
    min: Duration,
) -> BackendError {
    let mut d = match Dedicated::open(hs).await {
        Ok(d) => d,
        Err(e) => return e,
    };
    let setup = [wire(&["CLIENT", "ID"]), wire(&[&b"SUBSCRIBE"[..], CHANNEL])];
    let r = match tokio::time::timeout(hs.connect_timeout * 2, d.call(&setup, 2)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return e,
        Err(_) => return BackendError::Timeout(hs.addr.clone()),
    };
    let id = match parse_value(&r.get(0)) {
        Ok(Some((Value::Integer(id), _))) if id >= 0 => id as u64,
        _ => return BackendError::handshake(&hs.addr, "CLIENT ID refused"),
    };
    if !matches!(parse_value(&r.get(1)), Ok(Some((Value::Array(_), _)))) {
        return BackendError::handshake(&hs.addr, "SUBSCRIBE refused");
    }
    let (stream, mut buf) = d.into_parts();
    let (mut rd, mut wr) = stream.into_split();
    *backoff = min;
    tx.send_replace(Some(id));
    tracing::debug!(node = %hs.addr, id, "cache invalidation tracking is up");

    let mut framer = ReplyFramer::new(hs.max_reply_bulk);
    let ping = wire(&["PING"]);
    let mut tick = tokio::time::interval(PING_EVERY);
    let mut last_read = tokio::time::Instant::now();
    loop {
        while !buf.is_empty() {
            let len = match framer.next_len(&buf) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => return BackendError::protocol(&hs.addr, e),
            };
            let frame = buf.split_to(len).freeze();
            if let Some(ev) = invalidation(&frame) {
                on_event(ev);
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        tokio::select! {
            n = rd.read_buf(&mut buf) => match n {
                Ok(0) => return BackendError::io(&hs.addr, "connection closed by the node"),
                Ok(_) => last_read = tokio::time::Instant::now(),
                Err(e) => return BackendError::io(&hs.addr, e),
            },
            _ = tick.tick() => {
                if last_read.elapsed() > DEAD_AFTER {
                    return BackendError::Timeout(hs.addr.clone());
                }
                if let Err(e) = async { wr.write_all(&ping).await?; wr.flush().await }.await {
                    return BackendError::io(&hs.addr, e);
                }
            }
        }
    }
}

/// The invalidation a pub/sub frame carries, if it is one (pongs and the like are not).
fn invalidation(frame: &[u8]) -> Option<Invalidation> {
    let Ok(Some((Value::Array(mut parts), _))) = parse_value(frame) else {
        return None;
    };
    if parts.len() != 3 {
        return None;
    }
    let payload = parts.pop()?;
    match (&parts[0], &parts[1]) {
        (Value::Bulk(kind), Value::Bulk(ch))
            if kind.eq_ignore_ascii_case(b"message") && ch == CHANNEL => {}
        _ => return None,
    }
    match payload {
        Value::Array(keys) => Some(Invalidation::Keys(
            keys.into_iter()
                .filter_map(|k| match k {
                    Value::Bulk(k) => Some(k),
                    _ => None,
                })
                .collect(),
        )),
        Value::Nil | Value::NilArray => Some(Invalidation::All),
        _ => None,
    }
}

/// The connection that fills the read cache of one node: a shared pipelined connection with
/// tracking redirected to the node's tracker, rebuilt whenever the tracker's id changes.
///
/// Redis forgets what a client tracked when that client disconnects, so when the fill
/// connection drops (and reconnects as a new client), the keys it had read would no longer
/// be invalidated: the filler then reports `All` through the tracker's callback. The drop is seen by polling `is_up` every `POLL` ms, well inside the
/// shortest reconnect delay, during which the connection reads as down.
pub struct Filler {
    current: Arc<Mutex<Option<(u64, ConnHandle)>>>,
    ids: watch::Receiver<Option<u64>>,
    task: JoinHandle<()>,
}

const POLL: Duration = Duration::from_millis(5);

impl Filler {
    /// `hs` is the node's handshake (its protocol and database). Invalidations go to the
    /// tracker, not to this connection; a RESP3 one still gets a push if the tracker's
    /// connection closes, which ends it (shared connections take no pushes): the tracker
    /// reconnects with a new id then, and this connection is rebuilt for it anyway.
    /// `cluster`: the node's cluster, if any, so a fill that meets a redirection follows it.
    pub fn spawn(
        tracker: &Tracker,
        hs: &Handshake,
        metrics: NodeMetrics,
        cluster: Option<std::sync::Weak<super::cluster::Cluster>>,
    ) -> Filler {
        let on_event = tracker.on_event.clone();
        let current = Arc::new(Mutex::new(None));
        let mut ids = tracker.ids();
        let (cur, hs) = (current.clone(), hs.clone());
        let task = tokio::spawn(async move {
            loop {
                let id = *ids.borrow_and_update();
                let conn = id.map(|id| {
                    let hs = Handshake {
                        tracking_redirect: Some(id),
                        ..hs.clone()
                    };
                    ConnHandle::spawn(Arc::new(hs), metrics.clone(), cluster.clone())
                });
                // The old connection closes once the fills using it finish.
                *cur.lock().unwrap_or_else(|p| p.into_inner()) = id.zip(conn.clone());
                let mut was_up = false;
                loop {
                    tokio::select! {
                        r = ids.changed() => {
                            if r.is_err() {
                                return;
                            }
                            break;
                        }
                        _ = tokio::time::sleep(POLL) => {
                            let up = conn.as_ref().is_some_and(|c| c.is_up());
                            if was_up && !up {
                                tracing::warn!(node = %hs.addr, "cache fill connection lost; flushing the node's cached keys");
                                on_event(Invalidation::All);
                            }
                            was_up = up;
                        }
                    }
                }
            }
        });
        Filler {
            current,
            ids: tracker.ids(),
            task,
        }
    }

    /// The fill connection, or None while tracking is not in force for it (tracker down,
    /// reconnected and the filler not yet rebuilt, or the fill connection itself down):
    /// then the cache must not be filled.
    pub fn conn(&self) -> Option<ConnHandle> {
        let want = (*self.ids.borrow())?;
        let cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match &*cur {
            Some((id, conn)) if *id == want && conn.is_up() => Some(conn.clone()),
            _ => None,
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(parts: &[&[u8]], payload: &[u8]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", parts.len() + 1).into_bytes();
        for p in parts {
            v.extend(format!("${}\r\n", p.len()).bytes());
            v.extend_from_slice(p);
            v.extend_from_slice(b"\r\n");
        }
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn invalidation_messages_carry_keys_or_flush() {
        let keys = frame(&[b"message", CHANNEL], b"*2\r\n$1\r\na\r\n$2\r\nbc\r\n");
        assert_eq!(
            invalidation(&keys),
            Some(Invalidation::Keys(vec![
                Bytes::from("a"),
                Bytes::from("bc")
            ]))
        );
        let flush = frame(&[b"message", CHANNEL], b"*-1\r\n");
        assert_eq!(invalidation(&flush), Some(Invalidation::All));
        let flush = frame(&[b"message", CHANNEL], b"$-1\r\n");
        assert_eq!(invalidation(&flush), Some(Invalidation::All));
    }

    #[test]
    fn other_frames_are_not_invalidations() {
        assert_eq!(invalidation(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"), None);
        let other = frame(&[b"message", b"news"], b"*1\r\n$1\r\na\r\n");
        assert_eq!(invalidation(&other), None);
        let sub = frame(&[b"subscribe", CHANNEL], b":1\r\n");
        assert_eq!(invalidation(&sub), None);
        assert_eq!(invalidation(b"+OK\r\n"), None);
        assert_eq!(invalidation(b"*3\r\n$7\r\nmess"), None);
    }
}
