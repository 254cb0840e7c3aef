//! Commands learned from the nodes: what a node lists in `COMMAND LIST` and the built-in
//! table lacks (Redis 8's vector sets, Valkey 9's DELIFEQ and MSETEX, a module's commands)
//! becomes a `Spec` of its own, from the node's `COMMAND INFO`: arity, flags, ACL
//! categories and key positions (its key specs). The built-in table stays the authority
//! for every command it has; a learned one is looked up only when it has none
//! (`lookup::top`), so the request path of a built-in command is unchanged.
//!
//! A learned spec is leaked once and lives as long as the process, as the built-in ones
//! are `'static`: a node lists a few hundred commands at most, and a name is learned once.
//! `proxy::registry::version` reads the nodes' replies and `lookup::learn` decides what is learned;
//! this module parses nothing.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, RwLock};

use arc_swap::ArcSwap;

use super::{cat, flags, KeySpec, Route, Spec};

/// What a node's `COMMAND INFO` says of one command.
#[derive(Debug, Clone, Default)]
pub struct Learned {
    /// As the node gives it (any case); a subcommand's is `parent|sub`.
    pub name: String,
    pub arity: i32,
    /// Flag names: `write`, `readonly`, `blocking`, `movablekeys`, ...
    pub flags: Vec<String>,
    /// ACL categories, with or without their `@`.
    pub cats: Vec<String>,
    pub key_specs: Vec<KeySpecInfo>,
    pub subcommands: Vec<Learned>,
}

/// One key spec of `COMMAND INFO` (Redis 7+).
#[derive(Debug, Clone)]
pub struct KeySpecInfo {
    pub begin: BeginSearch,
    pub find: FindKeys,
}

#[derive(Debug, Clone)]
pub enum BeginSearch {
    /// The first key's argument index.
    Index(i64),
    /// After this keyword, searched from `startfrom` (negative: from the end).
    Keyword {
        keyword: String,
        startfrom: i64,
    },
    Unknown,
}

#[derive(Debug, Clone)]
pub enum FindKeys {
    /// `lastkey` relative to the first key (negative: from the end), every `keystep`.
    Range {
        lastkey: i64,
        keystep: i64,
        limit: i64,
    },
    /// The key count at `keynumidx`, the first key at `firstkey`, both relative to the
    /// first key's index.
    Keynum {
        keynumidx: i64,
        firstkey: i64,
        keystep: i64,
    },
    Unknown,
}

/// Learned specs by upper-case name (`VADD`, `FT.SEARCH`, `PARENT SUB`). Read on the
/// request path without a lock or an allocation (`get`); written rarely, copied whole on
/// each write under `WRITER`.
type Table = HashMap<Box<[u8]>, &'static Spec>;

fn table() -> &'static ArcSwap<Table> {
    static T: OnceLock<ArcSwap<Table>> = OnceLock::new();
    T.get_or_init(ArcSwap::default)
}

/// Held while the table is copied and swapped, so that no learned name is lost to a race.
static WRITER: Mutex<()> = Mutex::new(());

/// The arity a node gives a built-in command when it differs from the table's (Redis
/// 7.2's `ZRANK key member WITHSCORE` made ZRANK's -3 where 7.0 had 3), by name.
fn arities() -> &'static RwLock<HashMap<&'static str, i32>> {
    static A: OnceLock<RwLock<HashMap<&'static str, i32>>> = OnceLock::new();
    A.get_or_init(RwLock::default)
}

/// Adds `spec` under `name` (upper case); false when the name is taken or the table is
/// full. `lookup` decides what may be learned (`lookup::learn`).
pub(super) fn insert(name: &str, info: &Learned, container: bool) -> bool {
    let _w = WRITER.lock().unwrap_or_else(|p| p.into_inner());
    let now = table().load();
    if now.contains_key(name.as_bytes()) || now.len() >= MAX_LEARNED {
        return false;
    }
    let mut next = Table::clone(&now);
    next.insert(name.as_bytes().into(), leak(name, info, container));
    table().store(std::sync::Arc::new(next));
    true
}

/// Keeps `arity` for the built-in `spec`, unless the one kept already takes every count
/// it takes (the widest any node gave is kept).
pub(super) fn set_arity(spec: &'static Spec, arity: i32) {
    if spec.arity == arity || covers(spec.arity, arity) {
        return;
    }
    let mut a = arities().write().unwrap_or_else(|p| p.into_inner());
    let keep = match a.get(spec.name) {
        Some(&old) if covers(old, arity) => old,
        _ => arity,
    };
    a.insert(spec.name, keep);
}

/// Whether arity `a` accepts every count that arity `b` accepts.
fn covers(a: i32, b: i32) -> bool {
    match (a < 0, b < 0) {
        (true, true) => -a <= -b,
        (true, false) => b >= -a,
        (false, false) => a == b,
        (false, true) => false,
    }
}

/// Whether a node's arity for the built-in `spec` takes `argc` arguments.
pub(super) fn accepts(spec: &Spec, argc: usize) -> bool {
    let a = arities().read().unwrap_or_else(|p| p.into_inner());
    a.get(spec.name).is_some_and(|&arity| {
        if arity >= 0 {
            argc == arity as usize
        } else {
            argc >= (-arity) as usize
        }
    })
}

/// Most commands learned: a node that lists more is not believed past this.
const MAX_LEARNED: usize = 4096;

/// A learned command by name (any case; `PARENT SUB` for a subcommand).
pub(super) fn get(name: &[u8]) -> Option<&'static Spec> {
    // Upper-cased on the stack: no allocation per request.
    let mut upper = [0u8; MAX_NAME];
    let upper = upper.get_mut(..name.len())?;
    upper.copy_from_slice(name);
    upper.make_ascii_uppercase();
    table().load().get(&*upper).copied()
}

/// The longest learned name (`PARENT SUB` included) looked up.
pub(super) const MAX_NAME: usize = 130;

/// Every learned command and subcommand, by name.
pub fn learned() -> Vec<&'static Spec> {
    let t = table().load();
    let mut v: Vec<&'static Spec> = t.values().copied().collect();
    v.sort_by_key(|s| s.name);
    v
}

/// Whether `spec` is a learned one (not in the built-in table).
pub fn is_learned(spec: &Spec) -> bool {
    let all = super::all();
    let base = all.as_ptr() as usize;
    let at = spec as *const Spec as usize;
    !(at >= base && at < base + std::mem::size_of_val(all))
}

fn leak(name: &str, info: &Learned, container: bool) -> &'static Spec {
    Box::leak(Box::new(spec_of(
        Box::leak(name.to_string().into_boxed_str()),
        info,
        container,
    )))
}

/// The spec of a learned command.
fn spec_of(name: &'static str, info: &Learned, container: bool) -> Spec {
    let mut bits = 0;
    for f in &info.flags {
        bits |= flag_bit(&f.to_ascii_lowercase());
    }
    if container {
        bits |= flags::CONTAINER;
    }
    let mut cats = 0;
    for c in &info.cats {
        cats |= cat::by_name(c.trim_start_matches('@')).unwrap_or(0);
    }
    let keys = keys_of(&info.key_specs);
    let (keys, route) = match keys {
        Some(KeySpec::None) if bits & flags::MOVABLE_KEYS == 0 => (KeySpec::None, Route::AnyNode),
        Some(KeySpec::None) | None => {
            // Keys the proxy cannot find from the specs: the node alone can place them.
            bits |= flags::UNPLACED;
            (KeySpec::None, Route::AnyNode)
        }
        Some(k) if bits & flags::BLOCKING != 0 => (k, Route::Blocking),
        Some(k) => (k, Route::Keyed),
    };
    Spec {
        name,
        cmd: super::Cmd::Learned,
        arity: info.arity,
        flags: bits,
        cats,
        keys,
        route,
    }
}

/// The key positions of a command's key specs, when one spec of the kinds the table
/// knows gives them all: None when they cannot be found without the node.
fn keys_of(specs: &[KeySpecInfo]) -> Option<KeySpec> {
    let [one] = specs else {
        return specs.is_empty().then_some(KeySpec::None);
    };
    let BeginSearch::Index(at) = one.begin else {
        return None;
    };
    let small = |n: i64| u8::try_from(n).ok();
    match one.find {
        FindKeys::Range {
            lastkey,
            keystep,
            limit,
        } if limit <= 1 => {
            let first = small(at)?;
            let last = if lastkey >= 0 {
                i16::try_from(at + lastkey).ok()?
            } else {
                i16::try_from(lastkey).ok()?
            };
            Some(KeySpec::Range {
                first,
                last,
                step: small(keystep.max(1))?,
            })
        }
        FindKeys::Keynum {
            keynumidx,
            firstkey,
            keystep,
        } if firstkey > keynumidx => Some(KeySpec::NumKeys {
            at: small(at + keynumidx)?,
            first: small(firstkey - keynumidx)?,
            step: small(keystep.max(1))?,
        }),
        _ => None,
    }
}

fn flag_bit(name: &str) -> u32 {
    flags::NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map_or(0, |(bit, _)| *bit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(at: i64, lastkey: i64) -> KeySpecInfo {
        KeySpecInfo {
            begin: BeginSearch::Index(at),
            find: FindKeys::Range {
                lastkey,
                keystep: 1,
                limit: 0,
            },
        }
    }

    #[test]
    fn a_learned_command_is_looked_up_and_classified_like_a_built_in_one() {
        let vadd = Learned {
            name: "vaddtest".into(),
            arity: -1,
            flags: vec!["write".into(), "denyoom".into(), "module".into()],
            cats: vec![],
            key_specs: vec![range(1, 0)],
            subcommands: vec![],
        };
        assert!(super::super::learn(&vadd));
        assert!(!super::super::learn(&vadd), "learned once");
        let c = super::super::classify(&[b"VAddTest".as_slice(), b"k", b"1"][..]).unwrap();
        assert_eq!(c.spec.name, "VADDTEST");
        assert_eq!(c.route, Route::Keyed);
        assert_eq!(&c.keys[..], &[1]);
        assert!(c.spec.is_write());
        assert!(is_learned(c.spec));
        // A built-in command is never replaced.
        assert!(!super::super::learn(&Learned {
            name: "get".into(),
            ..vadd.clone()
        }));
        assert!(!is_learned(super::super::lookup(b"GET").unwrap()));
    }

    #[test]
    fn a_wider_arity_from_a_node_lets_its_forms_through() {
        let zrank = [b"ZRANK".as_slice(), b"z", b"m", b"WITHSCORE"];
        assert!(
            super::super::classify(&zrank[..]).is_err(),
            "7.0's arity is 3"
        );
        super::super::learn_arity("zrank", -3);
        assert!(super::super::classify(&zrank[..]).is_ok());
        assert!(
            super::super::classify(&zrank[..2]).is_err(),
            "too few still"
        );
        assert!(covers(-3, 3) && covers(-2, -3) && !covers(3, -3) && !covers(-4, 3));
    }

    #[test]
    fn key_specs_become_the_tables_key_positions() {
        assert_eq!(
            keys_of(&[range(1, -1)]),
            Some(KeySpec::Range {
                first: 1,
                last: -1,
                step: 1
            })
        );
        let keynum = KeySpecInfo {
            begin: BeginSearch::Index(1),
            find: FindKeys::Keynum {
                keynumidx: 0,
                firstkey: 1,
                keystep: 2,
            },
        };
        assert_eq!(
            keys_of(&[keynum]),
            Some(KeySpec::NumKeys {
                at: 1,
                first: 1,
                step: 2
            })
        );
        let keyword = KeySpecInfo {
            begin: BeginSearch::Keyword {
                keyword: "STREAMS".into(),
                startfrom: 1,
            },
            find: FindKeys::Unknown,
        };
        assert_eq!(keys_of(&[keyword]), None);
        assert_eq!(keys_of(&[range(1, 0), range(2, 0)]), None);
        assert_eq!(keys_of(&[]), Some(KeySpec::None));
    }

    #[test]
    fn a_learned_container_has_its_subcommands() {
        let sub = Learned {
            name: "ctest|get".into(),
            arity: 3,
            flags: vec!["readonly".into()],
            key_specs: vec![range(2, 0)],
            ..Learned::default()
        };
        assert!(super::super::learn(&Learned {
            name: "CTEST".into(),
            arity: -2,
            subcommands: vec![sub],
            ..Learned::default()
        }));
        let c = super::super::classify(&[b"ctest".as_slice(), b"get", b"k"][..]).unwrap();
        assert_eq!(c.spec.name, "CTEST GET");
        assert_eq!(&c.keys[..], &[2]);
        assert!(super::super::classify(&[b"ctest".as_slice(), b"nosuch"][..]).is_err());
    }
}
