//! The salt kinds, one file (or folder) each, every one implementing `kind::SaltKind`:
//! counters (strings and hashes salted by key), hashes placed by field, sets,
//! HyperLogLogs and sorted sets. A kind imports the engine (`kind`, `journal`, `merge`,
//! `names`, `record`, the salt table), never another kind; `of` is the one place a
//! `Kind` chooses its implementation.

pub mod counter;
pub mod fields;
pub mod hll;
pub mod set;
pub mod zset;

use super::kind::SaltKind;
use super::record::Kind;

/// The implementation of `kind`.
pub fn of(kind: Kind) -> &'static dyn SaltKind {
    match kind {
        Kind::String | Kind::Hash => &counter::Counters,
        Kind::Fields => &fields::Fields,
        Kind::Set => &set::Set,
        Kind::Hll => &hll::Hll,
        Kind::ZSet => &zset::ZSet,
    }
}
