//! One connection's state and the way out: what a session holds (its state, its
//! ordering rules, its transaction), the round that carries its commands to the nodes
//! and the writer that answers them in order.
//!
//! May touch: `registry` (a connection shows itself in CLIENT LIST, reads the tracking
//! registry) and the crate's modules below `proxy`. Not `act`, `answer` or `session`,
//! which stand on it.
//!
//! - `ctx`: what every session shares (backend, metrics, detector, rules, hot set, cache,
//!   salt table, the registries);
//! - `state`: one connection's state behind methods, and what a handler returns (`Flow`);
//! - `order`: the ordering rules; `txn`: MULTI's queue and the WATCH;
//! - `round`: a round's jobs, reply slots and keys; `reply`: the writer; `merge`: a
//!   fanned-out command's replies made one; `cost`: what a read cost, counted against its
//!   key;
//! - `dedicated`: a session's own node connection (blocking commands, WATCH);
//!   `tunnel`: the pub/sub pipe; `scan`: a pool's cursors.
//!
//! Where this room sits on the request's route: docs/architecture.md, "The request's
//! route".

pub(super) mod cost;
pub(super) mod ctx;
pub(super) mod dedicated;
pub(super) mod merge;
pub(super) mod order;
pub(super) mod reply;
pub(super) mod round;
pub(super) mod scan;
pub(super) mod state;
pub(super) mod tunnel;
pub(super) mod txn;
