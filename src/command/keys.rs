//! Key positions that depend on the arguments: numkeys blocks and the commands whose keys
//! follow a keyword (XREAD STREAMS, SORT STORE, MIGRATE KEYS, GEORADIUS STORE). Each
//! mirrors the server's own parsing (xreadCommand, sortGetKeys, migrateGetKeys..), so the
//! keys agree with `COMMAND GETKEYS` and the errors with the server's replies.

use smallvec::SmallVec;

use super::{Args, CommandError, Route, Spec};

type Keys = SmallVec<[u32; 4]>;

/// A fixed range; the arity check has already made it fit.
#[inline]
pub(super) fn range(
    spec: &'static Spec,
    argc: usize,
    first: u8,
    last: i16,
    step: u8,
    keys: &mut Keys,
) -> Result<(), CommandError> {
    let (first, step) = (first as usize, step.max(1) as usize);
    let last = if last < 0 {
        // MSET and MSETNX: key/value pairs must come whole, as msetGenericCommand checks.
        if step > 1 && argc.saturating_sub(first) % step != 0 {
            return Err(CommandError::Arity(spec));
        }
        argc as isize + last as isize
    } else {
        last as isize
    };
    let mut i = first;
    while i as isize <= last && i < argc {
        keys.push(i as u32);
        i += step;
    }
    Ok(())
}

/// A numkeys block: argument `at` counts the keys, the first of which is at `at + first`.
pub(super) fn numkeys<A: Args + ?Sized>(
    spec: &'static Spec,
    args: &A,
    at: usize,
    first: usize,
    step: usize,
    keys: &mut Keys,
) -> Result<Route, CommandError> {
    let argc = args.argc();
    if at >= argc {
        return Err(CommandError::Arity(spec));
    }
    let parsed = parse_i64(args.arg(at));
    let after = (argc - at - 1) as i64;
    let name = spec.name.as_bytes();
    let n = if name.starts_with(b"EVAL") || name.starts_with(b"FCALL") {
        // evalGenericCommand and fcallCommandGeneric: zero keys is fine (and keyless).
        let n = parsed.ok_or_else(|| {
            CommandError::syntax(if name.starts_with(b"FCALL") {
                "ERR Bad number of keys provided"
            } else {
                "ERR value is not an integer or out of range"
            })
        })?;
        if n > after {
            return Err(CommandError::syntax(
                "ERR Number of keys can't be greater than number of args",
            ));
        }
        if n < 0 {
            return Err(CommandError::syntax("ERR Number of keys can't be negative"));
        }
        if n == 0 {
            return Ok(Route::AnyNode);
        }
        n
    } else if name.starts_with(b"Z") && !name.ends_with(b"MPOP") {
        // zunionInterDiffGenericCommand, ZINTERCARD included.
        let n = parsed
            .ok_or_else(|| CommandError::syntax("ERR value is not an integer or out of range"))?;
        if n < 1 {
            return Err(CommandError::Syntax(
                format!(
                    "ERR at least 1 input key is needed for '{}' command",
                    spec.fullname()
                )
                .into(),
            ));
        }
        if n > after {
            return Err(CommandError::syntax("ERR syntax error"));
        }
        n
    } else {
        // SINTERCARD and the *MPOP family: getRangeLongFromObjectOrReply(1, LONG_MAX).
        let n = parsed
            .filter(|&n| n >= 1)
            .ok_or_else(|| CommandError::syntax("ERR numkeys should be greater than 0"))?;
        if n > after {
            return Err(CommandError::syntax(if name == b"SINTERCARD" {
                "ERR Number of keys can't be greater than number of args"
            } else {
                "ERR syntax error"
            }));
        }
        n
    };
    let mut i = at + first;
    for _ in 0..n {
        if i >= argc {
            break;
        }
        keys.push(i as u32);
        i += step;
    }
    Ok(spec.route)
}

/// The commands marked `KeySpec::Custom` in the table.
pub(super) fn custom<A: Args + ?Sized>(
    spec: &'static Spec,
    args: &A,
    keys: &mut Keys,
) -> Result<Route, CommandError> {
    match spec.name {
        "XREAD" => xread(spec, args, false, keys),
        "XREADGROUP" => xread(spec, args, true, keys),
        "SORT" => {
            sort(args, keys);
            Ok(spec.route)
        }
        "MIGRATE" => migrate(args, keys),
        "GEORADIUS" => {
            georadius(args, 6, keys);
            Ok(spec.route)
        }
        "GEORADIUSBYMEMBER" => {
            georadius(args, 5, keys);
            Ok(spec.route)
        }
        // Z{UNION,INTER,DIFF}STORE destination numkeys key [key ...]
        _ => {
            keys.push(1);
            numkeys(spec, args, 2, 1, 1, keys)
        }
    }
}

fn is<A: Args + ?Sized>(args: &A, i: usize, word: &[u8]) -> bool {
    args.arg(i).eq_ignore_ascii_case(word)
}

/// xreadCommand's option loop: BLOCK, COUNT, GROUP, NOACK, then STREAMS key.. id..
fn xread<A: Args + ?Sized>(
    spec: &'static Spec,
    args: &A,
    group: bool,
    keys: &mut Keys,
) -> Result<Route, CommandError> {
    let argc = args.argc();
    let (mut blocking, mut has_group) = (false, false);
    let mut i = 1;
    let streams = loop {
        if i >= argc {
            return Err(CommandError::syntax("ERR syntax error"));
        }
        let more = argc - i - 1;
        if is(args, i, b"BLOCK") && more > 0 {
            blocking = true;
            i += 1;
        } else if is(args, i, b"COUNT") && more > 0 {
            i += 1;
        } else if is(args, i, b"STREAMS") && more > 0 {
            break i + 1;
        } else if is(args, i, b"GROUP") && more >= 2 {
            if !group {
                return Err(CommandError::syntax(
                    "ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            has_group = true;
            i += 2;
        } else if is(args, i, b"NOACK") {
            if !group {
                return Err(CommandError::syntax(
                    "ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
        } else {
            return Err(CommandError::syntax("ERR syntax error"));
        }
        i += 1;
    };
    let count = argc - streams;
    if count & 1 == 1 {
        // The server says XREAD for XREADGROUP too.
        return Err(CommandError::syntax(
            "ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.",
        ));
    }
    if group && !has_group {
        return Err(CommandError::syntax(
            "ERR Missing GROUP option for XREADGROUP",
        ));
    }
    keys.extend((streams..streams + count / 2).map(|k| k as u32));
    Ok(if blocking {
        Route::Blocking
    } else {
        spec.route
    })
}

/// sortGetKeys: the sorted key, then the last STORE destination. Like the server it does
/// not step over STORE's argument, and BY/GET patterns are not keys.
fn sort<A: Args + ?Sized>(args: &A, keys: &mut Keys) {
    keys.push(1);
    let mut store = None;
    let mut i = 2;
    while i < args.argc() {
        if is(args, i, b"LIMIT") {
            i += 2;
        } else if is(args, i, b"GET") || is(args, i, b"BY") {
            i += 1;
        } else if is(args, i, b"STORE") && i + 1 < args.argc() {
            store = Some(i + 1);
        }
        i += 1;
    }
    keys.extend(store.map(|s| s as u32));
}

/// The keys that SORT's BY and GET patterns name, as patterns: the part before `->` of
/// each pattern with a `*` (Redis looks nothing up for `GET #`, or for a pattern without
/// `*`). These keys are in no key spec: Redis Cluster refuses them when they may lie in
/// another slot, and a pool must refuse them when they may lie on another node.
pub fn sort_patterns<'a, A: Args + ?Sized>(args: &'a A) -> SmallVec<[&'a [u8]; 2]> {
    let mut out = SmallVec::new();
    let mut i = 2;
    while i < args.argc() {
        if is(args, i, b"LIMIT") {
            i += 2;
        } else if (is(args, i, b"GET") || is(args, i, b"BY")) && i + 1 < args.argc() {
            let p = args.arg(i + 1);
            if let Some(star) = p.iter().position(|&b| b == b'*') {
                let end = p[star..]
                    .windows(2)
                    .position(|w| w == b"->")
                    .map_or(p.len(), |at| star + at);
                out.push(&p[..end]);
            }
            i += 1;
        }
        i += 1;
    }
    out
}

/// migrateGetKeys: argument 3, or everything after KEYS when argument 3 is empty.
fn migrate<A: Args + ?Sized>(args: &A, keys: &mut Keys) -> Result<Route, CommandError> {
    let argc = args.argc();
    let mut i = 6;
    while i < argc {
        if is(args, i, b"KEYS") {
            if !args.arg(3).is_empty() {
                return Err(CommandError::syntax(
                    "ERR When using MIGRATE KEYS option, the key argument must be set to the empty string",
                ));
            }
            if i + 1 == argc {
                // No key at all: nothing to route by; the server answers NOKEY.
                return Ok(Route::AnyNode);
            }
            keys.extend((i + 1..argc).map(|k| k as u32));
            return Ok(Route::Keyed);
        }
        if is(args, i, b"AUTH") {
            i += 1;
        } else if is(args, i, b"AUTH2") {
            i += 2;
        }
        i += 1;
    }
    keys.push(3);
    Ok(Route::Keyed)
}

/// The key, then each STORE/STOREDIST destination from the options on. The server's key
/// specs report the first of each keyword; listing every one also covers a repeated
/// keyword, where the last one is the destination actually written.
fn georadius<A: Args + ?Sized>(args: &A, options_from: usize, keys: &mut Keys) {
    keys.push(1);
    let mut i = options_from;
    while i + 1 < args.argc() {
        if is(args, i, b"STORE") || is(args, i, b"STOREDIST") {
            keys.push(i as u32 + 1);
            i += 1;
        }
        i += 1;
    }
}

/// Redis's string2ll, from the wire module: the one integer parser of the crate.
pub(super) use crate::resp::parse_i64;
