//! Commands answered in the proxy: connection state (PING, HELLO, AUTH, SELECT, INFO),
//! transactions, the CLIENT and ACL commands, the one-node cluster that cluster clients
//! see, and client-side caching.
//!
//! May touch: `act` (a transaction's commands go out like any other), `conn` and
//! `registry`, and the crate's modules below `proxy`. Not `session`.
//!
//! - `local`: the commands answered here, and transactions;
//! - `client_cmd`: the CLIENT commands; `client_cache`: CLIENT TRACKING and its kin, and
//!   which keys a tracking client is told about;
//! - `acl`: the ACL commands, on the proxy's users;
//! - `command`: COMMAND and its INFO, LIST, COUNT and DOCS, as the proxy serves them;
//! - `as_cluster`: CLUSTER SLOTS, SHARDS, NODES and kin, as one node owning every slot.
//!
//! Where this room sits on the request's route: docs/architecture.md, "The request's
//! route".

pub(super) mod acl;
pub(super) mod as_cluster;
pub(super) mod client_cache;
pub(super) mod client_cmd;
pub(super) mod command;
pub(super) mod local;
