//! Mitigations of hot keys, acted on by the session after `policy::decide`.
//!
//! `combine`: same-key increments batched into one backend write with exact replies.
//! Salting (write-hot keys spread over shard keys) and the read-hot cache are future work.

pub mod cache;
pub mod combine;
