//! The CLIENT commands about the proxy's own clients: SETNAME, GETNAME, ID, INFO, LIST,
//! KILL, PAUSE, UNPAUSE, UNBLOCK, REPLY (the session drops the replies), and the ones that
//! only answer OK (NO-EVICT, NO-TOUCH, SETINFO); client-side caching's are `client_cache`'s.

use bytes::{Bytes, BytesMut};

use crate::command::Classified;
use crate::command::Cmd;
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Flow, Session};
use crate::proxy::registry::clients;
use crate::resp::{encode_bulk, encode_int, encode_simple, Proto, Request, Value};

fn error(rb: &mut RoundBuilder, msg: &str) -> Flow {
    rb.slots.push(Slot::Ready(err_bytes(msg)));
    Flow::Continue
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

pub fn handle(s: &mut Session, req: &Request, c: &Classified, rb: &mut RoundBuilder) -> Flow {
    let spec = c.spec;
    let mut out = BytesMut::new();
    match spec.cmd {
        Cmd::ClientSetname => {
            let n = req.arg(2);
            if n.iter().any(|b| *b <= b' ' || *b > b'~') {
                error(
                    rb,
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
                return Flow::Continue;
            }
            s.set_name((!n.is_empty()).then(|| req.arg_bytes(2)));
            encode_simple("OK", &mut out);
        }
        Cmd::ClientGetname => match s.name() {
            Some(n) => encode_bulk(n, &mut out),
            None => Value::Nil.encode(s.proto(), &mut out),
        },
        Cmd::ClientId => encode_int(s.id() as i64, &mut out),
        Cmd::ClientInfo => {
            s.publish();
            text_reply(s.proto(), s.me.line(Some(spec)), &mut out);
        }
        Cmd::ClientList => {
            s.publish();
            let args: Vec<&[u8]> = (2..req.argc()).map(|i| req.arg(i)).collect();
            let f = match clients::parse_filter(&args, s.id(), false) {
                Ok(f) => f,
                Err(e) => {
                    error(rb, &e.to_string());
                    return Flow::Continue;
                }
            };
            let me = s.id();
            let text = s
                .ctx()
                .clients
                .select(&f)
                .iter()
                .map(|c| c.line((c.id == me).then_some(spec)))
                .collect();
            text_reply(s.proto(), text, &mut out);
        }
        Cmd::ClientKill => return client_kill(s, req, rb),
        Cmd::ClientPause => {
            let ms = match crate::resp::parse_i64(req.arg(2)) {
                None => return error(rb, "ERR timeout is not an integer or out of range"),
                Some(ms) if ms < 0 => return error(rb, "ERR timeout is negative"),
                Some(ms) => ms as u64,
            };
            let all = match req.argc() {
                3 => true,
                4 if req.arg(3).eq_ignore_ascii_case(b"ALL") => true,
                4 if req.arg(3).eq_ignore_ascii_case(b"WRITE") => false,
                4 => return error(rb, "ERR CLIENT PAUSE mode must be WRITE or ALL"),
                _ => return error(rb, "ERR unknown subcommand or wrong number of arguments for 'pause'. Try CLIENT HELP."),
            };
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            s.ctx().pause.pause(clients::Paused { until, all });
            tracing::info!(
                client = s.id(),
                ms,
                all,
                "CLIENT PAUSE: this proxy's clients pause"
            );
            encode_simple("OK", &mut out);
        }
        Cmd::ClientUnpause => {
            s.ctx().pause.unpause();
            encode_simple("OK", &mut out);
        }
        Cmd::ClientUnblock => return unblock(s, req, rb),
        Cmd::ClientTracking
        | Cmd::ClientCaching
        | Cmd::ClientGetredir
        | Cmd::ClientTrackinginfo => return super::client_cache::command(s, req, c, rb),
        Cmd::ClientNoEvict | Cmd::ClientNoTouch | Cmd::ClientSetinfo => {
            encode_simple("OK", &mut out)
        }
        // The session drops the replies (`Session::reply_quiet`); OFF and SKIP have none.
        Cmd::ClientReply => match upper(req.arg(2)).as_str() {
            "ON" => {
                s.set_reply_off(false);
                encode_simple("OK", &mut out);
            }
            "OFF" => {
                s.set_reply_off(true);
                return Flow::Continue;
            }
            "SKIP" => {
                s.skip_next_reply();
                return Flow::Continue;
            }
            _ => {
                error(rb, "ERR syntax error");
                return Flow::Continue;
            }
        },
        _ => {
            error(
                rb,
                &format!(
                    "ERR saltshaker: {} is not supported through the proxy",
                    spec.name
                ),
            );
            return Flow::Continue;
        }
    }
    rb.slots.push(Slot::Ready(out.freeze()));
    Flow::Continue
}

/// CLIENT INFO's and CLIENT LIST's text: a verbatim string in RESP3, a bulk in RESP2.
fn text_reply(proto: Proto, text: String, out: &mut BytesMut) {
    match proto {
        Proto::Resp3 => Value::Verbatim(Bytes::from(format!("txt:{text}"))).encode(proto, out),
        Proto::Resp2 => encode_bulk(text.as_bytes(), out),
    }
}

/// `CLIENT KILL addr:port` (the old form: OK, or an error when no client has that
/// address) and `CLIENT KILL <filter> <value> ...` (how many were closed), over this
/// proxy's clients. A client that kills itself (`SKIPME no`) gets its reply first.
fn client_kill(s: &mut Session, req: &Request, rb: &mut RoundBuilder) -> Flow {
    let mut out = BytesMut::new();
    if req.argc() == 3 {
        let f = clients::Filter {
            addr: Some(String::from_utf8_lossy(req.arg(2)).into_owned()),
            ..clients::Filter::default()
        };
        match s.ctx().clients.kill(&f) {
            0 => {
                error(rb, "ERR No such client");
            }
            _ => {
                encode_simple("OK", &mut out);
                rb.slots.push(Slot::Ready(out.freeze()));
            }
        }
        return Flow::Continue;
    }
    let args: Vec<&[u8]> = (2..req.argc()).map(|i| req.arg(i)).collect();
    let f = match clients::parse_filter(&args, s.id(), true) {
        Ok(f) => f,
        Err(e) => {
            error(rb, &e.to_string());
            return Flow::Continue;
        }
    };
    if let Some(u) = &f.user {
        if !s.ctx().users.names().iter().any(|n| n == u) {
            error(rb, &format!("ERR No such user '{u}'"));
            return Flow::Continue;
        }
    }
    encode_int(s.ctx().clients.kill(&f) as i64, &mut out);
    rb.slots.push(Slot::Ready(out.freeze()));
    Flow::Continue
}

/// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`: a client of this proxy blocked in a command on a
/// node is unblocked there (the node answers the blocked command as it would its own
/// client's: a timeout's reply, or the UNBLOCKED error), so nothing the node did is
/// lost. 1 if it was blocked, else 0.
fn unblock(s: &mut Session, req: &Request, rb: &mut RoundBuilder) -> Flow {
    let Some(id) = crate::resp::parse_i64(req.arg(2)) else {
        return error(rb, "ERR value is not an integer or out of range");
    };
    let mode: &[u8] = match req.argc() {
        3 => b"TIMEOUT",
        4 if req.arg(3).eq_ignore_ascii_case(b"TIMEOUT") => b"TIMEOUT",
        4 if req.arg(3).eq_ignore_ascii_case(b"ERROR") => b"ERROR",
        4 => return error(rb, "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
        _ => return error(rb, "ERR syntax error"),
    };
    let f = clients::Filter {
        ids: Some(vec![id as u64]),
        ..clients::Filter::default()
    };
    let target = s
        .ctx()
        .clients
        .select(&f)
        .first()
        .and_then(|c| c.blocked_on());
    let Some((node, node_id)) = target else {
        let mut out = BytesMut::new();
        encode_int(0, &mut out);
        rb.slots.push(Slot::Ready(out.freeze()));
        return Flow::Continue;
    };
    let id = node_id.to_string();
    let wire = Request::from_args(&[&b"CLIENT"[..], b"UNBLOCK", id.as_bytes(), mode]).wire();
    let part = crate::proxy::act::route::push(s, rb, node, wire);
    rb.slots.push(Slot::Reply(part));
    Flow::Continue
}
