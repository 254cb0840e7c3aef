//! Mitigations of hot keys, acted on by the session after `policy::decide`.
//!
//! `combine`: same-key increments batched into one backend write with exact replies.
//! `cache`: replies of read-hot keys, single-flight fills, invalidated by writes and tracking;
//! `store` holds them, evicting by node time saved per byte.
//! `balance`: the hottest keys of a node busier than the others, made read-hot for the cache.
//! Salting (write-hot keys spread over shard keys) lives in `salt`.

pub mod balance;
pub mod cache;
pub mod combine;
mod store;
