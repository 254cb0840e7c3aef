//! Process-wide registries: what every session of every worker thread shares, kept
//! behind a lock or atomics and touched per connection or per change, never per byte.
//!
//! May touch: the crate's modules below `proxy` (`backend`, `command`, `hotkey`,
//! `metrics`, `resp`, `auth`, `rules`). Nothing else of `proxy/`: every other room
//! stands on this one. The files import one way: `tracking` names `clients`.
//!
//! - `clients`: every connection as CLIENT LIST shows it;
//! - `tracking`: what the clients with CLIENT TRACKING read, and the nodes' tracked
//!   connections;
//! - `monitor`: MONITOR's lines and queues;
//! - `version`: what the proxy learns of its nodes (the Redis version HELLO reports,
//!   and the commands they know);
//! - `hotkeys`: HOTKEYS' session, summed from the detector's windows.
//!
//! Where this room sits on the request's route: docs/architecture.md, "The request's
//! route".

pub(super) mod clients;
pub(super) mod hotkeys;
pub(super) mod monitor;
pub(super) mod tracking;
pub(super) mod version;
