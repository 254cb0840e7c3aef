//! Reading a Redis Cluster's map from one node: `CLUSTER SHARDS` (Redis 7), or `CLUSTER
//! SLOTS` where SHARDS is unknown. The one map reader: startup asks its seeds through
//! connections of their own (`discover`), the running cluster asks its nodes through the
//! shared connections (`Cluster::read_map`); both hand it the way to ask.

use std::future::Future;

use super::slots::{self, Topology};
use super::{BackendError, Replies};

impl MapError {
    /// A failed call to `node`.
    pub fn call(node: &str, source: BackendError) -> MapError {
        MapError::Call {
            node: node.to_string(),
            source,
        }
    }
}
use crate::resp::{parse_value, Value};

/// Why a node gave no usable map. Each names the node asked.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The call failed: the node is down, timed out, or broke the connection.
    #[error("{node}: {source}")]
    Call { node: String, source: BackendError },
    /// It did not answer a question in time.
    #[error("{node}: no reply to {command} within {ms} ms")]
    Silent {
        node: String,
        command: String,
        ms: u128,
    },
    /// Its reply is not RESP, or not a map the proxy can read.
    #[error("{node}: unreadable {what}")]
    Unreadable { node: String, what: String },
    /// It answered both questions with an error (cluster support disabled, ...).
    #[error("{node}: {message}")]
    Refused { node: String, message: String },
    /// Its map covers no slot: the cluster is not created yet.
    #[error("{node}: the cluster owns no slots (is it created?)")]
    NoSlots { node: String },
    /// There was no node to ask.
    #[error("no node to ask")]
    NoNode,
}

/// The map from `node`, asked through `ask` (one command, one reply; its failure names
/// the node). `tls`: the proxy
/// reaches nodes over TLS, so it takes their `tls-port` where both are given.
pub async fn read<F, Fut>(node: &str, tls: bool, ask: F) -> Result<Topology, MapError>
where
    F: Fn(&'static [&'static str]) -> Fut,
    Fut: Future<Output = Result<Replies, MapError>>,
{
    let value = |r: Result<Replies, MapError>| -> Result<Value, MapError> {
        let r = r?;
        match parse_value(&r.get(0)) {
            Ok(Some((v, _))) => Ok(v),
            _ => Err(MapError::Unreadable {
                node: node.to_string(),
                what: "reply".into(),
            }),
        }
    };
    let unreadable = |reply: &str, what: &str| MapError::Unreadable {
        node: node.to_string(),
        what: format!("{reply} reply: {what}"),
    };
    let topo = match value(ask(&["CLUSTER", "SHARDS"]).await)? {
        Value::Error(_) => match value(ask(&["CLUSTER", "SLOTS"]).await)? {
            Value::Error(e) => {
                return Err(MapError::Refused {
                    node: node.to_string(),
                    message: String::from_utf8_lossy(&e).into_owned(),
                })
            }
            v => slots::parse_slots(&v).map_err(|w| unreadable("CLUSTER SLOTS", w))?,
        },
        v => slots::parse_shards(&v, tls).map_err(|w| unreadable("CLUSTER SHARDS", w))?,
    };
    if topo.covered() == 0 {
        return Err(MapError::NoSlots {
            node: node.to_string(),
        });
    }
    Ok(topo)
}
