//! Case-insensitive name lookup without allocation: two open-addressing indexes over the
//! generated table (commands, and "PARENT SUB" subcommands), built at compile time. A
//! name they lack is looked for among the commands learned from the nodes (`learned`).

use super::learned::{self, Learned};
use super::table::SPECS;
use super::{Route, Spec};

/// Every command and subcommand the proxy knows, sorted by name.
pub fn all() -> &'static [Spec] {
    &ALL
}

/// A command by name, any case: "get", "GET". Also takes a subcommand written
/// "client setname" or "client|setname".
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    if let Some(spec) = top(name) {
        return Some(spec);
    }
    let cut = name.iter().position(|&b| b == b' ' || b == b'|')?;
    lookup_sub(&name[..cut], &name[cut + 1..])
}

/// A subcommand by its container's name and its own, any case: ("CONFIG", "get").
pub fn lookup_sub(parent: &[u8], sub_name: &[u8]) -> Option<&'static Spec> {
    let parent = top(parent).filter(|p| p.is_container())?;
    sub(parent, sub_name)
}

static ALL: [Spec; SPECS.len()] = SPECS;
static TOP: [u16; TOP_SLOTS] = build::<TOP_SLOTS>(false);
static SUB: [u16; SUB_SLOTS] = build::<SUB_SLOTS>(true);

// Power-of-two sizes at most half full, so probes stay short.
const TOP_SLOTS: usize = 1024;
const SUB_SLOTS: usize = 512;
// Longer than any command name: such input is unknown without hashing it.
const MAX_NAME: usize = 32;
const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a over the upper-cased bytes, so "get" and "GET" land in the same slot.
#[inline(always)]
const fn hash(mut h: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let upper = if b.is_ascii_lowercase() { b - 32 } else { b };
        h = (h ^ upper as u32).wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

const fn has_space(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        if name[i] == b' ' {
            return true;
        }
        i += 1;
    }
    false
}

/// Slot values are index + 1 into SPECS; 0 is empty.
const fn build<const N: usize>(subcommands: bool) -> [u16; N] {
    let mut slots = [0u16; N];
    let mut used = 0;
    let mut i = 0;
    while i < SPECS.len() {
        let name = SPECS[i].name.as_bytes();
        if has_space(name) == subcommands {
            assert!(
                name.len() <= MAX_NAME || subcommands,
                "command name too long"
            );
            let mut at = hash(FNV_OFFSET, name) as usize & (N - 1);
            while slots[at] != 0 {
                at = (at + 1) & (N - 1);
            }
            slots[at] = (i + 1) as u16;
            used += 1;
        }
        i += 1;
    }
    assert!(used * 2 <= N, "index more than half full: grow it");
    slots
}

#[inline]
fn probe<const N: usize>(
    slots: &'static [u16; N],
    h: u32,
    matches: impl Fn(&Spec) -> bool,
) -> Option<&'static Spec> {
    let mut at = h as usize & (N - 1);
    loop {
        let slot = slots[at];
        if slot == 0 {
            return None;
        }
        let spec = &ALL[slot as usize - 1];
        if matches(spec) {
            return Some(spec);
        }
        at = (at + 1) & (N - 1);
    }
}

/// A top-level command (never a subcommand, even if `name` holds a space).
#[inline]
pub(super) fn top(name: &[u8]) -> Option<&'static Spec> {
    if name.len() <= MAX_NAME {
        let found = probe(&TOP, hash(FNV_OFFSET, name), |spec| {
            spec.name.as_bytes().eq_ignore_ascii_case(name)
        });
        if found.is_some() {
            return found;
        }
    }
    // Not built in: one the nodes taught us, if any (`learned`).
    if name.contains(&b' ') {
        return None;
    }
    learned::get(name)
}

/// A subcommand of `parent`, which comes from the table.
pub(super) fn sub(parent: &'static Spec, sub_name: &[u8]) -> Option<&'static Spec> {
    let p = parent.name.as_bytes();
    if sub_name.len() > MAX_NAME {
        return None;
    }
    if !learned::is_learned(parent) {
        let h = hash(hash(hash(FNV_OFFSET, p), b" "), sub_name);
        let found = probe(&SUB, h, |spec| {
            let n = spec.name.as_bytes();
            n.len() == p.len() + 1 + sub_name.len()
                && n.starts_with(p)
                && n[p.len()] == b' '
                && n[p.len() + 1..].eq_ignore_ascii_case(sub_name)
        });
        if found.is_some() {
            return found;
        }
    }
    // A learned container's, or one a newer node added to a built-in container; the name
    // put together on the stack (no allocation per request).
    let mut full = [0u8; learned::MAX_NAME];
    let n = p.len() + 1 + sub_name.len();
    let full = full.get_mut(..n)?;
    full[..p.len()].copy_from_slice(p);
    full[p.len()] = b' ';
    full[p.len() + 1..].copy_from_slice(sub_name);
    learned::get(full)
}

/// Learns a command the built-in table lacks, with its subcommands (`learned`); a
/// `parent|sub` name (Redis 7.2+ list subcommands so) is a subcommand of a built-in
/// container. False when it is known already, or the learned table is full.
pub fn learn(info: &Learned) -> bool {
    let name = info.name.to_ascii_uppercase();
    if let Some((parent, sub_name)) = name.split_once('|') {
        return learn_sub(parent, sub_name, info);
    }
    if name.is_empty() || name.len() > 64 || top(name.as_bytes()).is_some() {
        return false;
    }
    if !learned::insert(&name, info, !info.subcommands.is_empty()) {
        return false;
    }
    for s in &info.subcommands {
        let sub_name = s.name.rsplit('|').next().unwrap_or_default();
        if !sub_name.is_empty() {
            learned::insert(
                &format!("{name} {}", sub_name.to_ascii_uppercase()),
                s,
                false,
            );
        }
    }
    true
}

/// A subcommand a newer node added to a built-in container (`OBJECT`, `MEMORY`, `XINFO`,
/// ...). The containers the proxy answers or refuses itself (ACL, CLUSTER) keep their own
/// answers: a subcommand of theirs is never sent to a node.
fn learn_sub(parent: &str, sub_name: &str, info: &Learned) -> bool {
    let Some(p) = top(parent.as_bytes()) else {
        return false;
    };
    let own = matches!(p.route, Route::Local | Route::Unsupported(_));
    if !p.is_container() || own || learned::is_learned(p) {
        return false;
    }
    if sub_name.is_empty() || sub(p, sub_name.as_bytes()).is_some() {
        return false;
    }
    learned::insert(&format!("{} {sub_name}", p.name), info, false)
}

/// A built-in command's arity as a node gives it: a form the node accepts and the table's
/// arity does not is then let through (keys found as the table finds them). A node that
/// lacks the form answers for itself.
pub fn learn_arity(name: &str, arity: i32) {
    if let Some(spec) = lookup(name.replace('|', " ").as_bytes()) {
        if !learned::is_learned(spec) {
            learned::set_arity(spec, arity);
        }
    }
}
