//! The session's side of client-side caching (`tracking` holds the proxy's side):
//! `CLIENT TRACKING`, `CACHING`, `GETREDIR` and `TRACKINGINFO` with Redis's replies and
//! errors, and which keys of each command the client is told about.

use bytes::{Bytes, BytesMut};

use crate::command::{flags, Classified, Cmd, Route};
use crate::metrics::Class;
use crate::policy::Action;
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Flow, Session};
use crate::proxy::registry::tracking::{Mode, Tracking};
use crate::resp::{encode_int, encode_simple, Proto, Request, Value};

/// A refusal's error text (most are fixed; a prefix overlap names the prefixes).
type Refused = std::borrow::Cow<'static, str>;

const SWITCH_BCAST: &str = "ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.";
const SWITCH_OPT: &str = "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.";

/// CLIENT TRACKING, CACHING, GETREDIR, TRACKINGINFO.
pub fn command(s: &mut Session, req: &Request, c: &Classified, rb: &mut RoundBuilder) -> Flow {
    let mut out = BytesMut::new();
    let reply = match c.spec.cmd {
        Cmd::ClientTracking => tracking(s, req),
        Cmd::ClientCaching => caching(s, req),
        Cmd::ClientGetredir => {
            encode_int(
                s.tracking.as_ref().map_or(-1, |t| t.redirect as i64),
                &mut out,
            );
            Ok(())
        }
        _ => {
            let (flags, redirect, prefixes) = match &s.tracking {
                Some(t) => (
                    t.flags(),
                    t.redirect as i64,
                    t.prefixes.clone().unwrap_or_default(),
                ),
                None => (vec!["off"], -1, Vec::new()),
            };
            let bulk = |t: &str| Value::Bulk(Bytes::copy_from_slice(t.as_bytes()));
            Value::Map(vec![
                (
                    bulk("flags"),
                    Value::Set(flags.into_iter().map(bulk).collect()),
                ),
                (bulk("redirect"), Value::Integer(redirect)),
                (
                    bulk("prefixes"),
                    Value::Array(prefixes.into_iter().map(Value::Bulk).collect()),
                ),
            ])
            .encode(s.proto(), &mut out);
            Ok(())
        }
    };
    let slot = match reply {
        Ok(()) if out.is_empty() => {
            encode_simple("OK", &mut out);
            Slot::Ready(out.freeze())
        }
        Ok(()) => Slot::Ready(out.freeze()),
        Err(e) => Slot::Ready(err_bytes(&e)),
    };
    rb.slots.push(slot);
    Flow::Continue
}

/// `CLIENT TRACKING ON|OFF [REDIRECT id] [BCAST] [PREFIX p ...] [OPTIN] [OPTOUT] [NOLOOP]`,
/// its options checked in Redis's order.
fn tracking(s: &mut Session, req: &Request) -> Result<(), Refused> {
    let (mut redirect, mut bcast, mut optin, mut optout, mut noloop) =
        (None, false, false, false, false);
    let mut prefixes: Vec<Bytes> = Vec::new();
    let mut j = 3;
    while j < req.argc() {
        let more = req.argc() - 1 - j > 0;
        match req.arg(j).to_ascii_uppercase().as_slice() {
            b"REDIRECT" if more => {
                j += 1;
                if redirect.is_some() {
                    return Err("ERR A client can only redirect to a single other client".into());
                }
                let id = crate::resp::parse_i64(req.arg(j))
                    .ok_or("ERR value is not an integer or out of range")?;
                if !s.ctx().clients.exists(id) {
                    return Err("ERR The client ID you want redirect to does not exist".into());
                }
                redirect = Some(id);
            }
            b"BCAST" => bcast = true,
            b"OPTIN" => optin = true,
            b"OPTOUT" => optout = true,
            b"NOLOOP" => noloop = true,
            b"PREFIX" if more => {
                j += 1;
                prefixes.push(req.arg_bytes(j));
            }
            _ => return Err("ERR syntax error".into()),
        }
        j += 1;
    }
    match req.arg(2).to_ascii_uppercase().as_slice() {
        b"ON" => {}
        b"OFF" => {
            if s.tracking.take().is_some() {
                s.ctx().tracking.leave(s.id());
            }
            s.settle_next();
            return Ok(());
        }
        _ => return Err("ERR syntax error".into()),
    }
    if !bcast && !prefixes.is_empty() {
        return Err("ERR PREFIX option requires BCAST mode to be enabled".into());
    }
    let was_bcast = s.tracking.as_ref().map(|t| t.prefixes.is_some());
    if was_bcast.is_some_and(|b| b != bcast) {
        return Err(SWITCH_BCAST.into());
    }
    if bcast && (optin || optout) {
        return Err("ERR OPTIN and OPTOUT are not compatible with BCAST".into());
    }
    if optin && optout {
        return Err("ERR You can't specify both OPTIN mode and OPTOUT mode".into());
    }
    let was = s.tracking.as_ref().map(|t| t.mode);
    if (optin && was == Some(Mode::OptOut)) || (optout && was == Some(Mode::OptIn)) {
        return Err(SWITCH_OPT.into());
    }
    // Broadcasting: the prefixes are added to the client's own, none overlapping.
    let mut all_prefixes = None;
    if bcast {
        let had = s
            .tracking
            .as_ref()
            .and_then(|t| t.prefixes.clone())
            .unwrap_or_default();
        check_prefixes(&had, &prefixes)?;
        let mut all = had;
        if prefixes.is_empty() {
            prefixes.push(Bytes::new());
        }
        all.extend(prefixes);
        all.sort();
        all.dedup();
        all_prefixes = Some(all);
    }
    let mode = match (optin, optout) {
        (true, _) => Mode::OptIn,
        (_, true) => Mode::OptOut,
        _ => Mode::All,
    };
    let redirect = redirect.map_or(0, |id| id as u64);
    s.ctx()
        .tracking
        .join(s.id(), if redirect == 0 { s.id() } else { redirect });
    if let Some(p) = &all_prefixes {
        s.ctx().tracking.broadcast_to(s.id(), p.clone());
    } else if s.proto() == Proto::Resp3 || redirect != 0 {
        s.ctx().tracking.prepare(s.proto(), s.db());
    }
    s.tracking = Some(Box::new(Tracking {
        redirect,
        mode,
        noloop,
        caching: false,
        spent: false,
        prefixes: all_prefixes,
        on_tracked: Vec::new(),
    }));
    // Its commands go on the node's tracked connection from now on: the next one leaves
    // once everything sent before has arrived.
    s.settle_next();
    Ok(())
}

/// Redis's check that no two prefixes of a client overlap (one is a prefix of the other):
/// the new ones against those it has, then against each other.
fn check_prefixes(had: &[Bytes], new: &[Bytes]) -> Result<(), Refused> {
    let overlap = |a: &[u8], b: &[u8]| a.starts_with(b) || b.starts_with(a);
    let show = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for (i, p) in new.iter().enumerate() {
        if let Some(h) = had.iter().find(|h| overlap(h, p)) {
            return Err(format!("ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must not overlap.", show(p), show(h)).into());
        }
        if let Some(q) = new[i + 1..].iter().find(|q| overlap(p, q)) {
            return Err(format!("ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a single client must not overlap.", show(p), show(q)).into());
        }
    }
    Ok(())
}

/// `CLIENT CACHING YES|NO`: for the next command (or the rest of a MULTI).
fn caching(s: &mut Session, req: &Request) -> Result<(), Refused> {
    let Some(t) = s.tracking.as_mut() else {
        return Err("ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled".into());
    };
    match (req.arg(2).to_ascii_uppercase().as_slice(), t.mode) {
        (b"YES", Mode::OptIn) | (b"NO", Mode::OptOut) => t.caching = true,
        (b"YES", _) => {
            return Err(
                "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode."
                    .into(),
            )
        }
        (b"NO", _) => {
            return Err(
                "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode."
                    .into(),
            )
        }
        _ => return Err("ERR syntax error".into()),
    }
    Ok(())
}

/// Before a command of a tracking client runs: the keys it reads are remembered for it
/// (read on the node's tracked connection, so the node says when they change), or, where
/// the node cannot track them, the client is told at once after the reply; a NOLOOP
/// client is not told of its own writes. A read-hot key is read from the node, not from
/// the proxy's cache: the client caches it itself.
pub fn note(s: &mut Session, req: &Request, c: &Classified, class: Class, action: &mut Action) {
    let (proto, in_multi, id) = (s.proto(), s.txn().in_multi(), s.id());
    let Some(t) = s.tracking.as_mut().filter(|t| t.prefixes.is_none()) else {
        return;
    };
    // CLIENT CACHING's flag lasts for the next command (or to the end of a MULTI): it is
    // cleared before the one after, once that command has seen it.
    if std::mem::take(&mut t.spent) {
        t.caching = false;
    }
    if c.spec.cmd == Cmd::ClientCaching {
        return;
    }
    let remembers = t.remembers();
    // As Redis: no CLIENT subcommand spends it, nor MULTI or a command queued after it.
    let cmd = c.spec.cmd;
    t.spent = cmd.family() != Cmd::Client && ((!in_multi && cmd != Cmd::Multi) || cmd == Cmd::Exec);
    let noloop = t.noloop;
    // Without REDIRECT, a RESP2 client is sent nothing (as on Redis).
    if proto != Proto::Resp3 && t.redirect == 0 {
        return;
    }
    let ct = s.ctx().tracking.clone();
    if class == Class::Write && noloop {
        for &k in c.keys.iter() {
            ct.forget(req.arg(k as usize), id);
        }
    }
    if !c.spec.has(flags::READ) || c.keys.is_empty() || !remembers {
        return;
    }
    let untracked = match action {
        Action::Cache(_) | Action::CachePerKey(_) => {
            *action = Action::Forward;
            false
        }
        Action::Salted(_) | Action::Idempotent { .. } => true,
        // A blocking read, or a transaction under WATCH, runs on a connection of its own.
        _ => matches!(c.route, Route::Blocking) || (s.txn().in_multi() && s.txn().watching()),
    };
    let (hot, rules) = (s.ctx().hot.load(), s.ctx().rules.snapshot());
    let first = s.ctx().backend.node_for(req.arg(c.keys[0] as usize));
    for &k in c.keys.iter() {
        let key = req.arg(k as usize);
        let node = s.ctx().backend.node_for(key);
        // Whether the node tracks for the proxy now: as `switches` found it for this
        // command's first key, or asked here for the others.
        let tracked = || {
            let known = s
                .tracking
                .as_deref()
                .filter(|_| node == first)
                .and_then(|t| t.on_tracked.get(node).copied().flatten());
            known.unwrap_or_else(|| ct.conn(node, proto, s.db()).is_some())
        };
        if !hot.client_may_keep(key, &rules) {
            // `read.client_cache: { keys: hot_only }` and the key is not read-hot.
            ct.now(key, id, "not_hot");
        } else if !untracked && tracked() {
            ct.remember(key, id);
        } else {
            ct.now(key, id, "untracked");
        }
    }
}

/// Whether a tracking client's command goes to its node on another connection than its
/// last one there (the node's tracked connection came up or went down meanwhile): it then
/// waits for everything sent before, as at a lane change, so that a read never overtakes
/// the client's own write on the other connection.
pub fn switches(s: &mut Session, req: &Request, c: &Classified) -> bool {
    let (proto, db) = (s.proto(), s.db());
    let told = |t: &Tracking| t.prefixes.is_none() && (proto == Proto::Resp3 || t.redirect != 0);
    let (Some(&k), true) = (c.keys.first(), s.tracking.as_deref().is_some_and(told)) else {
        return false;
    };
    let node = s.ctx().backend.node_for(req.arg(k as usize));
    let up = s.ctx().tracking.conn(node, proto, db).is_some();
    let Some(t) = s.tracking.as_deref_mut() else {
        return false;
    };
    if t.on_tracked.len() <= node {
        t.on_tracked.resize(node + 1, None);
    }
    t.on_tracked[node].replace(up).is_some_and(|was| was != up)
}
