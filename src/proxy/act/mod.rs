//! The act phase for commands that go to the nodes: a command's jobs in the round, its
//! splits and fan-outs, the mitigations (combine, cache, salting) and the commands that
//! need several nodes' work made one (SORT, a STORE destination on another node).
//!
//! May touch: `conn` (the state, the round, the merges) and `registry`, and the crate's
//! modules below `proxy`. Not `answer` or `session`.
//!
//! - `route`: node jobs, splits, all nodes;
//! - `mitigation`: combine and cache; `salted`: acting on a salt plan;
//! - `sort`, `store`: SORT, and a STORE destination, across a pool's nodes;
//! - `unplaced`: a learned command whose keys only a node can find (`COMMAND GETKEYS`).
//!
//! Where this room sits on the request's route: docs/architecture.md, "The request's
//! route".

pub(super) mod mitigation;
pub(super) mod route;
pub(super) mod salted;
pub(super) mod sort;
pub(super) mod store;
pub(super) mod unplaced;
