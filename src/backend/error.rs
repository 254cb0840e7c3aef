//! The backend's errors: a request's (`BackendError`, which names the node in every case),
//! setting the backend up from the config (`SetupError`), and a read that has no node to
//! go to (`NoReplica`).

use crate::net::tls::TlsError;

/// Why a backend request failed. Display is the text a client sees after "ERR saltshaker: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("backend {node} is down ({reason})")]
    Down { node: String, reason: String },
    #[error("backend {node} connection error: {reason}")]
    Io { node: String, reason: String },
    #[error("backend {node} protocol error: {reason}")]
    Protocol { node: String, reason: String },
    #[error("cannot connect to backend {node}: {reason}")]
    Connect { node: String, reason: String },
    #[error("backend {node} handshake failed: {reason}")]
    Handshake { node: String, reason: String },
    /// The connection's task is gone (the proxy shutting down, or a connection replaced).
    #[error("backend {0} connection closed")]
    Closed(String),
    #[error("backend {0} did not answer in time")]
    Timeout(String),
}

impl BackendError {
    pub fn io(node: &str, reason: impl std::fmt::Display) -> Self {
        BackendError::Io {
            node: node.to_string(),
            reason: reason.to_string(),
        }
    }

    pub fn protocol(node: &str, reason: impl std::fmt::Display) -> Self {
        BackendError::Protocol {
            node: node.to_string(),
            reason: reason.to_string(),
        }
    }

    pub fn handshake(node: &str, reason: impl std::fmt::Display) -> Self {
        BackendError::Handshake {
            node: node.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Why the backend could not be set up from the config: the field or server at fault.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A TLS setting that cannot be loaded (certificate, key, CA).
    #[error("{field}: {error}")]
    Tls { field: String, error: TlsError },
    /// A twemproxy server line that does not parse.
    #[error("server {line:?}: {why} (expected \"host:port:weight [name]\")")]
    Server { line: String, why: &'static str },
    #[error("server {0:?} has weight 0")]
    ZeroWeight(String),
    #[error("two servers share the name {0:?}")]
    SharedName(String),
    #[error(transparent)]
    Unknown(#[from] UnknownName),
}

/// A setting's value that names nothing the proxy knows (a hash function, a distribution).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {setting} {value:?} (known: {known})")]
pub struct UnknownName {
    pub setting: &'static str,
    pub value: String,
    pub known: String,
}

/// A read with `read_from: replica` whose slot's master has no healthy replica now.
#[derive(Debug, Clone, thiserror::Error)]
#[error("ERR saltshaker: read_from is replica, and master {master} of slot {slot} has no healthy replica now")]
pub struct NoReplica {
    pub master: String,
    pub slot: u32,
}
