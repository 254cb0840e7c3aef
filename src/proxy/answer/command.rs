//! COMMAND, COMMAND INFO, LIST, COUNT and DOCS through the proxy: what it serves, not what
//! one node knows. A node's reply is taken (so a module's or a newer node's commands are
//! there), the commands the proxy refuses are taken out of it (`command::refused`: SAVE,
//! SHUTDOWN, MODULE, CLUSTER ADDSLOTS, ...; a name asked for by COMMAND INFO or DOCS gets
//! the nil Redis gives an unknown one), and the proxy's own (`command::own`: HOTKEYS,
//! SALTSHAKER.INCRBY) are put in where the node lacks them. A cluster client that reads
//! key positions from `COMMAND` then finds every command it may send, and no other.
//!
//! The node's reply comes in a task of the session (these are asked once per connection,
//! not per request), and the next command waits for it.

use bytes::Bytes;
use smallvec::smallvec;

use crate::command::{self, cat, flags, Classified, Cmd, KeySpec, Spec};
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{parse_value, Proto, Request, Value};

/// Which form was asked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    All,
    Info,
    List,
    Count,
    Docs,
}

pub(in crate::proxy) fn handle(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    rb: &mut RoundBuilder,
) {
    let form = match c.spec.cmd {
        Cmd::Command => Form::All,
        Cmd::CommandInfo => Form::Info,
        Cmd::CommandList => Form::List,
        Cmd::CommandCount => Form::Count,
        _ => Form::Docs,
    };
    // COUNT counts what LIST shows.
    let ask = match form {
        Form::Count => crate::backend::wire(&["COMMAND", "LIST"]),
        _ => req.wire(),
    };
    let args: Vec<Bytes> = req.args().skip(2).map(Bytes::copy_from_slice).collect();
    let node = s.ctx().backend.any_node();
    let conn = s.conn(node);
    let proto = s.proto();
    let deadline = s
        .ctx()
        .backend
        .request_timeout
        .map(|t| tokio::time::Instant::now() + t);
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let reply = match conn.call(smallvec![ask], 1, deadline).await {
            Err(e) => err_bytes(&format!("ERR saltshaker: {e}")),
            Ok(r) => {
                let raw = r.get(0);
                match parse_value(&raw) {
                    Ok(Some((Value::Error(_), _))) | Err(_) | Ok(None) => raw,
                    Ok(Some((v, _))) => served(form, &args, v, proto).to_bytes(proto),
                }
            }
        };
        let _ = tx.send(reply);
    });
    rb.slots.push(Slot::Later(rx));
    s.settle_next();
}

/// The node's reply `v` made what the proxy serves.
fn served(form: Form, args: &[Bytes], v: Value, proto: Proto) -> Value {
    match (form, v) {
        (Form::All, Value::Array(entries)) => {
            let mut out: Vec<Value> = entries.into_iter().filter_map(kept_entry).collect();
            let have: Vec<Vec<u8>> = out.iter().filter_map(entry_name).collect();
            for spec in command::own() {
                if !have
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(spec.name.as_bytes()))
                {
                    out.push(info_entry(spec, proto));
                }
            }
            Value::Array(out)
        }
        (Form::Info, Value::Array(entries)) => Value::Array(
            entries
                .into_iter()
                .zip(args)
                .map(|(e, name)| {
                    if command::refused(name) {
                        return Value::Nil;
                    }
                    match e {
                        Value::Nil | Value::NilArray => {
                            own_spec(name).map_or(Value::Nil, |spec| info_entry(spec, proto))
                        }
                        e => kept_entry(e).unwrap_or(Value::Nil),
                    }
                })
                .collect(),
        ),
        (Form::List | Form::Count, Value::Array(names) | Value::Set(names)) => {
            let mut out: Vec<Value> = names
                .into_iter()
                .filter(|n| text(n).is_none_or(|n| !command::refused(n)))
                .collect();
            for spec in command::own() {
                let name = spec.name.to_ascii_lowercase();
                let listed = out
                    .iter()
                    .any(|n| text(n).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())));
                if !listed && list_filter(args, spec) {
                    out.push(Value::Bulk(Bytes::from(name)));
                }
            }
            match form {
                // COUNT counts commands, as the node does: not `parent|sub` names.
                Form::Count => Value::Integer(
                    out.iter()
                        .filter(|n| text(n).is_some_and(|n| !n.contains(&b'|')))
                        .count() as i64,
                ),
                _ => Value::Array(out),
            }
        }
        (Form::Docs, v) => docs(args, v),
        (_, v) => v,
    }
}

/// A node's COMMAND INFO entry without what the proxy refuses: None for a refused command,
/// and a container's refused subcommands left out.
fn kept_entry(e: Value) -> Option<Value> {
    let name = entry_name(&e)?;
    if command::refused(&name) {
        return None;
    }
    let Value::Array(mut fields) = e else {
        return Some(e);
    };
    if let Some(Value::Array(subs)) = fields.get_mut(9) {
        subs.retain(|sub| entry_name(sub).is_none_or(|n| !command::refused(&n)));
    }
    Some(Value::Array(fields))
}

fn entry_name(e: &Value) -> Option<Vec<u8>> {
    match e {
        Value::Array(f) => text(f.first()?).map(<[u8]>::to_vec),
        _ => None,
    }
}

fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::Bulk(b) | Value::Simple(b) => Some(b),
        _ => None,
    }
}

/// The proxy's own command named `name`, if it is one.
fn own_spec(name: &[u8]) -> Option<&'static Spec> {
    command::own().find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether COMMAND LIST's `FILTERBY` (in `args`) lets the proxy's command `spec` through.
fn list_filter(args: &[Bytes], spec: &Spec) -> bool {
    match args {
        [] => true,
        [by, kind, value] if by.eq_ignore_ascii_case(b"FILTERBY") => {
            if kind.eq_ignore_ascii_case(b"PATTERN") {
                crate::glob::stringmatch(
                    &value.to_ascii_lowercase(),
                    spec.name.to_ascii_lowercase().as_bytes(),
                )
            } else if kind.eq_ignore_ascii_case(b"ACLCAT") {
                let c = String::from_utf8_lossy(value);
                cat::by_name(c.trim_start_matches('@')).is_some_and(|bit| spec.cats & bit != 0)
            } else {
                false // MODULE: the proxy's commands are no module's
            }
        }
        _ => false,
    }
}

/// COMMAND INFO's entry for a command of the proxy's own table: Redis 7's ten fields.
fn info_entry(spec: &'static Spec, proto: Proto) -> Value {
    let simple = |s: &str| Value::Simple(Bytes::copy_from_slice(s.as_bytes()));
    let set = |items: Vec<Value>| match proto {
        Proto::Resp3 => Value::Set(items),
        Proto::Resp2 => Value::Array(items),
    };
    let map = |pairs: Vec<(&str, Value)>| {
        Value::Map(pairs.into_iter().map(|(k, v)| (simple(k), v)).collect())
    };
    let flag_names = flags::NAMES
        .iter()
        .filter(|(bit, _)| spec.flags & bit != 0)
        .map(|(_, n)| simple(n))
        .collect();
    let cats = cat::NAMES
        .iter()
        .enumerate()
        .filter(|(i, _)| spec.cats & (1 << i) != 0)
        .map(|(_, n)| simple(&format!("@{n}")))
        .collect();
    let (first, last, step, key_specs) = match spec.keys {
        KeySpec::Range { first, last, step } => {
            let lastkey = if last >= 0 {
                last as i64 - first as i64
            } else {
                last as i64
            };
            let access = if spec.is_write() {
                ["RW", "UPDATE"]
            } else {
                ["RO", "ACCESS"]
            };
            let ks = map(vec![
                ("flags", set(access.iter().map(|f| simple(f)).collect())),
                (
                    "begin_search",
                    map(vec![
                        ("type", simple("index")),
                        ("spec", map(vec![("index", Value::Integer(first as i64))])),
                    ]),
                ),
                (
                    "find_keys",
                    map(vec![
                        ("type", simple("range")),
                        (
                            "spec",
                            map(vec![
                                ("lastkey", Value::Integer(lastkey)),
                                ("keystep", Value::Integer(step as i64)),
                                ("limit", Value::Integer(0)),
                            ]),
                        ),
                    ]),
                ),
            ]);
            (first as i64, last as i64, step as i64, vec![ks])
        }
        _ => (0, 0, 0, Vec::new()),
    };
    let subs = if spec.is_container() {
        command::subcommands(spec)
            .map(|s| info_entry(s, proto))
            .collect()
    } else {
        Vec::new()
    };
    Value::Array(vec![
        Value::Bulk(Bytes::from(spec.fullname())),
        Value::Integer(spec.arity as i64),
        set(flag_names),
        Value::Integer(first),
        Value::Integer(last),
        Value::Integer(step),
        set(cats),
        Value::Array(Vec::new()),
        Value::Array(key_specs),
        Value::Array(subs),
    ])
}

/// COMMAND DOCS: the refused ones out; the proxy's own in when every command was asked for
/// (no names), or asked for by name and missing.
fn docs(args: &[Bytes], v: Value) -> Value {
    let pairs = match v {
        Value::Map(pairs) => pairs,
        Value::Array(flat) => {
            let mut it = flat.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        v => return v,
    };
    let mut out: Vec<(Value, Value)> = pairs
        .into_iter()
        .filter(|(k, _)| text(k).is_none_or(|n| !command::refused(n)))
        .collect();
    for spec in command::own() {
        let name = spec.fullname();
        let listed = out
            .iter()
            .any(|(k, _)| text(k).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())));
        let asked = args.is_empty() || args.iter().any(|a| a.eq_ignore_ascii_case(name.as_bytes()));
        if !listed && asked {
            out.push((Value::Bulk(Bytes::from(name)), own_doc(spec)));
        }
    }
    // A RESP2 client gets it flat, as the node's own reply was.
    Value::Map(out)
}

fn own_doc(spec: &'static Spec) -> Value {
    let simple = |s: &str| Value::Simple(Bytes::copy_from_slice(s.as_bytes()));
    let bulk = |s: &str| Value::Bulk(Bytes::copy_from_slice(s.as_bytes()));
    let (summary, group) = command::own_doc(spec);
    Value::Map(vec![
        (simple("summary"), bulk(summary)),
        (simple("since"), bulk(env!("CARGO_PKG_VERSION"))),
        (simple("group"), bulk(group)),
        (simple("complexity"), bulk("O(1)")),
    ])
}
