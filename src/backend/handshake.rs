//! Opening a connection to a node: TCP, then TLS when the node speaks it, then AUTH,
//! HELLO, SELECT, READONLY and CLIENT TRACKING in one round trip.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{BackendConfig, BackendError, SetupError};
use crate::net::tls::{ClientTlsConfig, Connector, TlsError};
use crate::net::Stream;
use crate::resp::{encode_command, Proto, ReplyFramer};

/// Everything needed to open a connection to one node in a given protocol and database.
#[derive(Debug, Clone)]
pub struct Handshake {
    pub addr: String,
    pub proto: Proto,
    pub db: u32,
    pub username: Option<String>,
    pub password: Option<String>,
    pub connect_timeout: Duration,
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    pub max_reply_bulk: usize,
    /// Turn on Redis client-side caching for this connection, with invalidations sent to
    /// this client id (a `tracking::Tracker`): the connection that fills the read cache.
    pub tracking_redirect: Option<u64>,
    /// With `tracking_redirect`: broadcasting mode (BCAST), every key written on the node,
    /// read through this connection or not (client-side caching's BCAST clients).
    pub tracking_bcast: bool,
    /// Send READONLY: a cluster replica then serves reads of its master's slots (on a
    /// master it changes nothing, so a node that changes role keeps working).
    pub readonly: bool,
    /// TLS to the node, when it speaks TLS.
    pub tls: Option<Arc<Connector>>,
    /// `CLIENT SETNAME`: a connection that carries one client (a pub/sub tunnel) keeps the
    /// name that client gave itself.
    pub name: Option<bytes::Bytes>,
}

/// The TLS settings of every node, loaded once: `backend.tls`, and `tls_per_node` in its
/// place for the nodes it names.
#[derive(Debug, Default)]
pub struct NodeTls {
    all: Option<Arc<Connector>>,
    per_node: std::collections::HashMap<String, Arc<Connector>>,
}

impl NodeTls {
    pub fn load(cfg: &BackendConfig) -> Result<NodeTls, SetupError> {
        let load = |field: String, c: &ClientTlsConfig| {
            Connector::new(c)
                .map(Arc::new)
                .map_err(|error: TlsError| SetupError::Tls { field, error })
        };
        let all = match &cfg.tls {
            Some(c) => Some(load("backend.tls".into(), c)?),
            None => None,
        };
        let mut per_node = std::collections::HashMap::new();
        for (addr, c) in &cfg.tls_per_node {
            per_node.insert(
                addr.clone(),
                load(format!("backend.tls_per_node.{addr}"), c)?,
            );
        }
        Ok(NodeTls { all, per_node })
    }

    pub fn for_addr(&self, addr: &str) -> Option<Arc<Connector>> {
        self.per_node.get(addr).or(self.all.as_ref()).cloned()
    }
}

impl Handshake {
    /// A node's handshake in RESP2, database 0, as the backend settings say.
    pub fn base(
        cfg: &BackendConfig,
        addr: String,
        max_reply_bulk: usize,
        tls: &NodeTls,
    ) -> Handshake {
        Handshake {
            tls: tls.for_addr(&addr),
            addr,
            proto: Proto::Resp2,
            db: 0,
            username: cfg.username.clone(),
            password: cfg.password.clone(),
            connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
            reconnect_min_ms: cfg.reconnect_min_ms,
            reconnect_max_ms: cfg.reconnect_max_ms,
            max_reply_bulk,
            tracking_redirect: None,
            tracking_bcast: false,
            readonly: false,
            name: None,
        }
    }
}

impl Handshake {
    /// Connects, authenticates, and switches protocol and database. One round trip.
    pub async fn connect(&self) -> Result<Stream, BackendError> {
        let connect = async {
            let tcp = TcpStream::connect(&self.addr).await?;
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                Some(tls) => tls.connect(&self.addr, tcp).await,
                None => Ok(Stream::Tcp(tcp)),
            }
        };
        let mut s = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(BackendError::Connect {
                    node: self.addr.clone(),
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(BackendError::Connect {
                    node: self.addr.clone(),
                    reason: "connect timed out".into(),
                })
            }
        };
        let mut out = BytesMut::new();
        let mut n = 0;
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => {
                encode_command(&[b"AUTH".as_slice(), u.as_bytes(), p.as_bytes()], &mut out);
                n += 1;
            }
            (None, Some(p)) => {
                encode_command(&[b"AUTH".as_slice(), p.as_bytes()], &mut out);
                n += 1;
            }
            _ => {}
        }
        if self.proto == Proto::Resp3 {
            encode_command(&[b"HELLO".as_slice(), b"3"], &mut out);
            n += 1;
        }
        if self.db != 0 {
            encode_command(
                &[b"SELECT".as_slice(), self.db.to_string().as_bytes()],
                &mut out,
            );
            n += 1;
        }
        if self.readonly {
            encode_command(&[b"READONLY".as_slice()], &mut out);
            n += 1;
        }
        if let Some(name) = &self.name {
            encode_command(&[b"CLIENT".as_slice(), b"SETNAME", name], &mut out);
            n += 1;
        }
        if let Some(id) = self.tracking_redirect {
            let id = id.to_string();
            let mut cmd: Vec<&[u8]> =
                vec![b"CLIENT", b"TRACKING", b"on", b"REDIRECT", id.as_bytes()];
            if self.tracking_bcast {
                cmd.push(b"BCAST");
            }
            encode_command(&cmd, &mut out);
            n += 1;
        }
        if n == 0 {
            return Ok(s);
        }
        let work = async {
            s.write_all(&out)
                .await
                .map_err(|e| BackendError::handshake(&self.addr, e))?;
            s.flush()
                .await
                .map_err(|e| BackendError::handshake(&self.addr, e))?;
            let mut buf = BytesMut::with_capacity(1024);
            let mut framer = ReplyFramer::new(1 << 20);
            let mut seen = 0;
            let mut pos = 0;
            while seen < n {
                match framer.next_len(&buf[pos..]) {
                    Ok(Some(len)) => {
                        if buf[pos] == b'-' {
                            let msg = String::from_utf8_lossy(&buf[pos + 1..pos + len])
                                .trim_end()
                                .to_string();
                            return Err(BackendError::handshake(&self.addr, msg));
                        }
                        pos += len;
                        seen += 1;
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(BackendError::protocol(&self.addr, e)),
                }
                if s.read_buf(&mut buf)
                    .await
                    .map_err(|e| BackendError::handshake(&self.addr, e))?
                    == 0
                {
                    return Err(BackendError::handshake(
                        &self.addr,
                        "connection closed during handshake",
                    ));
                }
            }
            Ok(())
        };
        match tokio::time::timeout(self.connect_timeout * 2, work).await {
            Ok(Ok(())) => Ok(s),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BackendError::handshake(
                &self.addr,
                "no answer to the handshake",
            )),
        }
    }
}
