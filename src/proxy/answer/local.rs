//! Commands the proxy answers itself (connection state: PING, HELLO, AUTH, SELECT, CLIENT,
//! INFO) and transactions (MULTI/EXEC/DISCARD/WATCH/UNWATCH), which need session state.

use bytes::{Bytes, BytesMut};

use super::as_cluster;
use crate::command::{flags, Classified, Cmd, Route};
use crate::proxy::act::route::{keys_node, push, push_n};
use crate::proxy::conn::dedicated::DedicatedWorker;
use crate::proxy::conn::round::{Merge, RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, ready_later, reset_dedicated, Flow, Session};
use crate::resp::{
    encode_bulk, encode_int, encode_map_header, encode_simple, Proto, Request, Value,
};

const OK: &[u8] = b"+OK\r\n";

fn ready(rb: &mut RoundBuilder, b: &'static [u8]) {
    rb.slots.push(Slot::Ready(Bytes::from_static(b)));
}

fn error(rb: &mut RoundBuilder, msg: &str) {
    rb.slots.push(Slot::Ready(err_bytes(msg)));
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

pub fn handle(s: &mut Session, req: &Request, c: &Classified, rb: &mut RoundBuilder) -> Flow {
    let mut out = BytesMut::new();
    match c.spec.cmd {
        // PING's table arity is -1; Redis's pingCommand refuses more than one argument.
        Cmd::Ping if req.argc() > 2 => {
            error(rb, "ERR wrong number of arguments for 'ping' command");
            return Flow::Continue;
        }
        // AUTH's table arity is -2; Redis's authCommand refuses more than two arguments.
        Cmd::Auth if req.argc() > 3 => {
            error(rb, "ERR syntax error");
            return Flow::Continue;
        }
        Cmd::Ping => {
            if req.argc() > 1 {
                encode_bulk(req.arg(1), &mut out);
            } else {
                encode_simple("PONG", &mut out);
            }
        }
        Cmd::Echo => encode_bulk(req.arg(1), &mut out),
        Cmd::Quit => {
            ready(rb, OK);
            return Flow::Close;
        }
        Cmd::Asking | Cmd::Readonly | Cmd::Readwrite => {
            out.extend_from_slice(&as_cluster::answer(s, req, c.spec))
        }
        cmd if cmd.family() == Cmd::Cluster => {
            out.extend_from_slice(&as_cluster::answer(s, req, c.spec))
        }
        Cmd::Auth => {
            let user = (req.argc() > 2).then(|| req.arg(1));
            match check_auth(s, user, req.arg(req.argc() - 1)) {
                Ok(()) => encode_simple("OK", &mut out),
                Err(e) => {
                    error(rb, e);
                    return Flow::Continue;
                }
            }
        }
        Cmd::Hello => return hello(s, req, rb),
        Cmd::Command | Cmd::CommandInfo | Cmd::CommandList | Cmd::CommandCount | Cmd::CommandDocs => {
            super::command::handle(s, req, c, rb);
            return Flow::Continue;
        }
        Cmd::Select => {
            match select_index(s, req.arg(1)) {
                Ok(d) => {
                    set_db(s, d);
                    ready(rb, OK);
                }
                Err(e) => error(rb, e),
            }
            return Flow::Continue;
        }
        Cmd::Reset => {
            s.txn_mut().reset();
            s.set_name(None);
            let initial = s.ctx().users.initial();
            s.log_in(initial);
            s.switch_to(Proto::Resp2, 0);
            reset_dedicated(s);
            ready(rb, b"+RESET\r\n");
            return Flow::Continue;
        }
        Cmd::Info => {
            let nodes = s.ctx().backend.len();
            let parts = (0..nodes).map(|n| push(s, rb, n, req.wire())).collect();
            let addrs = s
                .ctx()
                .backend
                .nodes()
                .iter()
                .map(|n| n.addr.clone())
                .collect();
            let proxy = proxy_info(s);
            let (blocked, blocked_asks) = blocked_clients(s, rb);
            rb.slots.push(Slot::Merge(Box::new(Merge::Info {
                proxy,
                parts,
                addrs,
                clients: s.ctx().metrics.client_connections.get(),
                blocked,
                blocked_asks,
                tracking: (s.ctx().tracking.clients(), s.ctx().tracking.keys()),
            })));
            return Flow::Continue;
        }
        // Clients test how they take an error with DEBUG ERROR; it touches no node, so the
        // proxy answers it. Every other DEBUG acts on one node's internals.
        Cmd::Debug if req.argc() == 3 && req.arg(1).eq_ignore_ascii_case(b"ERROR") => {
            let msg = String::from_utf8_lossy(req.arg(2)).replace(['\r', '\n'], " ");
            error(rb, &msg);
            return Flow::Continue;
        }
        Cmd::Debug => error(rb, "ERR saltshaker: DEBUG is refused through the proxy (but DEBUG ERROR): it acts on one node's internals. Run it on the node directly"),
        cmd if cmd.family() == Cmd::Acl => return super::acl::handle(s, req, c.spec, rb),
        cmd if cmd.family() == Cmd::Client => return super::client_cmd::handle(s, req, c, rb),
        Cmd::Monitor => {
            ready(rb, b"+OK\r\n");
            return Flow::Monitor;
        }
        Cmd::ObjectFreq => encode_int(object_freq(s, req.arg(2)), &mut out),
        cmd if cmd.family() == Cmd::Hotkeys => {
            let valkey = s.ctx().version.get().server == "valkey";
            out.extend_from_slice(&s.ctx().hotkeys.command(c.spec.cmd, req, s.proto(), valkey))
        }
        _ => error(
            rb,
            &format!("ERR saltshaker: {} is not supported through the proxy", c.spec.name),
        ),
    }
    if !out.is_empty() {
        rb.slots.push(Slot::Ready(out.freeze()));
    }
    Flow::Continue
}

/// INFO's `blocked_clients`: a client counts once its command is blocked where it waits.
/// Tools and test suites wait for the count to rise and then act (Redis's stream tests
/// DEL the key a `XREADGROUP ... BLOCK 0` waits on), so a client whose command is on its
/// way to its node must not count yet. Clients held by CLIENT PAUSE in the proxy count at
/// once; for the others, each node that holds one is asked which of their connections
/// it has blocked (`CLIENT LIST ID ...`, its `b` flag): the parts that `Merge::Info`
/// reads. INFO is rare; it pays for that.
fn blocked_clients(
    s: &mut Session,
    rb: &mut RoundBuilder,
) -> (i64, Vec<crate::proxy::conn::round::Part>) {
    let mut here = 0;
    let mut on_nodes: Vec<(usize, Vec<String>)> = Vec::new();
    for c in s
        .ctx()
        .clients
        .select(&crate::proxy::registry::clients::Filter::default())
    {
        match c.blocked_where() {
            Some(None) => here += 1,
            Some(Some((node, id))) if id != 0 => {
                match on_nodes.iter_mut().find(|(n, _)| *n == node) {
                    Some((_, ids)) => ids.push(id.to_string()),
                    None => on_nodes.push((node, vec![id.to_string()])),
                }
            }
            _ => {}
        }
    }
    let asks = on_nodes
        .into_iter()
        .map(|(node, ids)| {
            let mut args = vec!["CLIENT", "LIST", "ID"];
            args.extend(ids.iter().map(String::as_str));
            push(s, rb, node, crate::backend::wire(&args))
        })
        .collect();
    (here, asks)
}

/// `OBJECT FREQ key` from the proxy's own sketches, on Redis's LFU scale: a key counted
/// N times has a counter of about 5 + sqrt(N / 5) with the default `lfu-log-factor` 10,
/// and N here is the key's reads and writes per second over the last window, times 60. A
/// key the detector does not list gets 0. Unsampled, and whatever the nodes' eviction
/// policy, so `redis-cli --hotkeys` (SCAN, then OBJECT FREQ of each key) ranks keys as the
/// proxy sees them.
fn object_freq(s: &Session, key: &[u8]) -> i64 {
    let snap = s.ctx().detector.snapshot();
    let rate = snap
        .keys
        .iter()
        .find(|k| k.key == key)
        .map(|k| k.reads_per_sec + k.writes_per_sec)
        .or_else(|| {
            snap.read_rates
                .iter()
                .find(|(k, _)| &k[..] == key)
                .map(|(_, r)| *r)
        })
        .unwrap_or(0.0);
    if rate <= 0.0 {
        return 0;
    }
    (5.0 + (rate * 60.0 / 5.0).sqrt()).min(255.0) as i64
}

fn check_auth(s: &mut Session, user: Option<&[u8]>, pass: &[u8]) -> Result<(), &'static str> {
    match s.ctx().users.login(user, pass) {
        Ok(u) => {
            s.log_in(Some(u));
            Ok(())
        }
        Err(e) => {
            if e == crate::auth::WRONGPASS {
                s.ctx().metrics.security.auth_failures.inc();
                let name = String::from_utf8_lossy(user.unwrap_or(b"default")).into_owned();
                s.log_refusal("auth", "AUTH".into(), &name);
                tracing::info!(client = s.id(), peer = %s.peer(), user = %String::from_utf8_lossy(user.unwrap_or(b"default")), "AUTH refused");
            }
            Err(e)
        }
    }
}

/// The database `SELECT arg` selects, or Redis's error (the proxy's over a pool, which
/// serves database 0 only).
fn select_index(s: &Session, arg: &[u8]) -> Result<u32, &'static str> {
    let db = std::str::from_utf8(arg)
        .ok()
        .and_then(|d| d.parse::<u32>().ok())
        .ok_or("ERR value is not an integer or out of range")?;
    match db {
        0 => Ok(0),
        _ if !s.ctx().backend.is_single() => {
            Err("ERR saltshaker: SELECT is not supported over a pool of nodes (only database 0)")
        }
        d if d >= s.ctx().backend.databases() => Err("ERR DB index is out of range"),
        d => Ok(d),
    }
}

fn set_db(s: &mut Session, db: u32) {
    if s.switch_to(s.proto(), db) {
        reset_dedicated(s);
    }
}

/// HELLO [protover [AUTH username password] [SETNAME clientname]]
fn hello(s: &mut Session, req: &Request, rb: &mut RoundBuilder) -> Flow {
    let mut proto = s.proto();
    let mut i = 1;
    if req.argc() > 1 {
        proto = match req.arg(1) {
            b"2" => Proto::Resp2,
            b"3" => Proto::Resp3,
            v if std::str::from_utf8(v)
                .ok()
                .and_then(|x| x.parse::<i64>().ok())
                .is_some() =>
            {
                error(rb, "NOPROTO unsupported protocol version");
                return Flow::Continue;
            }
            _ => {
                error(rb, "ERR Protocol version is not an integer or out of range");
                return Flow::Continue;
            }
        };
        i = 2;
    }
    while i < req.argc() {
        match upper(req.arg(i)).as_str() {
            "AUTH" if i + 2 < req.argc() => {
                if let Err(e) = check_auth(s, Some(req.arg(i + 1)), req.arg(i + 2)) {
                    error(rb, e);
                    return Flow::Continue;
                }
                i += 3;
            }
            "SETNAME" if i + 1 < req.argc() => {
                s.set_name(Some(req.arg_bytes(i + 1)));
                i += 2;
            }
            _ => {
                error(
                    rb,
                    &format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(req.arg(i))
                    ),
                );
                return Flow::Continue;
            }
        }
    }
    if s.user().is_none() {
        error(rb, "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
        return Flow::Continue;
    }
    if s.switch_to(proto, s.db()) {
        reset_dedicated(s);
    }
    let reported = s.ctx().version.get();
    let fields: Vec<(Value, Value)> = vec![
        (bulk("server"), bulk(reported.server)),
        (bulk("version"), bulk(&reported.version)),
        (
            bulk("proto"),
            Value::Integer(if proto == Proto::Resp3 { 3 } else { 2 }),
        ),
        (bulk("id"), Value::Integer(s.id() as i64)),
        (bulk("mode"), bulk("standalone")),
        (bulk("role"), bulk("master")),
        (bulk("modules"), Value::Array(vec![])),
    ];
    let mut out = BytesMut::new();
    encode_map_header(fields.len(), proto, &mut out);
    for (k, v) in &fields {
        k.encode(proto, &mut out);
        v.encode(proto, &mut out);
    }
    rb.slots.push(Slot::Ready(out.freeze()));
    Flow::Continue
}

fn bulk(s: &str) -> Value {
    Value::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

fn proxy_info(s: &Session) -> String {
    let b = &s.ctx().backend;
    let up = b.nodes().iter().filter(|n| n.is_up()).count();
    format!(
        "# Proxy\r\nsaltshaker_version:{}\r\nproxy_uptime_in_seconds:{}\r\nbackend_nodes:{}\r\nbackend_nodes_up:{}\r\nconnected_clients:{}\r\nhello_server:{}\r\nhello_version:{}\r\nlearned_commands:{}\r\n\r\n",
        env!("CARGO_PKG_VERSION"),
        s.ctx().started.elapsed().as_secs(),
        b.len(),
        up,
        s.ctx().metrics.client_connections.get(),
        s.ctx().version.get().server,
        s.ctx().version.get().version,
        crate::command::learned().len(),
    )
}

/// MULTI, EXEC, DISCARD, WATCH, UNWATCH.
pub fn transaction(s: &mut Session, req: &Request, c: &Classified, rb: &mut RoundBuilder) -> Flow {
    match c.spec.cmd {
        Cmd::Multi => {
            if s.txn_mut().begin() {
                ready(rb, OK);
            } else {
                error(rb, "ERR MULTI calls can not be nested");
            }
        }
        Cmd::Discard => {
            if s.txn_mut().discard() {
                ready(rb, OK);
            } else {
                error(rb, "ERR DISCARD without MULTI");
            }
        }
        Cmd::Exec => exec(s, rb),
        Cmd::Watch => {
            if s.txn().in_multi() {
                error(rb, "ERR WATCH inside MULTI is not allowed");
                return Flow::Continue;
            }
            let node = match keys_node(s, req, c) {
                Ok(n) => n,
                Err(e) => {
                    rb.slots.push(Slot::Ready(e));
                    return Flow::Continue;
                }
            };
            let hs = s.ctx().backend.node(node).handshake(s.proto(), s.db());
            let gone = s.gone();
            let open = || DedicatedWorker::spawn(hs, gone, false);
            match s.txn_mut().watch(node, open) {
                Ok(w) => rb.slots.push(Slot::Later(w.call(vec![req.wire()], 1))),
                Err(_) => {
                    error(
                        rb,
                        "ERR saltshaker: WATCH of keys on different nodes is not supported",
                    );
                    return Flow::Continue;
                }
            }
            // The session's next commands go on the shared connections: they wait until
            // the keys are watched (a write of its own must abort the EXEC, as on Redis).
            s.settle_next();
        }
        Cmd::Unwatch => {
            if let Some(w) = s.txn_mut().unwatch() {
                rb.slots.push(Slot::Later(w.call(vec![req.wire()], 1)));
            } else {
                ready(rb, OK);
            }
        }
        _ => error(
            rb,
            &format!("ERR saltshaker: {} is not supported", c.spec.name),
        ),
    }
    Flow::Continue
}

fn exec(s: &mut Session, rb: &mut RoundBuilder) {
    let Some((tx, watch)) = s.txn_mut().exec() else {
        error(rb, "ERR EXEC without MULTI");
        return;
    };
    if tx.dirty {
        if let Some(w) = watch {
            // Release the watch on the node as EXEC would.
            // Sent at once; nobody waits for the reply.
            drop(w.call(vec![crate::backend::wire(&["UNWATCH"])], 1));
        }
        error(
            rb,
            "EXECABORT Transaction discarded because of previous errors.",
        );
        return;
    }
    // The transaction's writes drop their keys' cached replies, as a write outside MULTI
    // does, and this session's next reads of them wait for EXEC's reply.
    crate::proxy::act::mitigation::invalidate_keys(s, &tx.writes, rb);
    // What the proxy answers itself runs now, in queue order: it touches only this
    // connection's state, so running it before the node runs the rest changes no reply.
    let locals: Vec<(usize, Bytes)> = tx
        .locals
        .iter()
        .map(|(at, req)| (*at, run_queued_local(s, req)))
        .collect();
    let count = tx.wires.len() + 2;
    let mut wires = Vec::with_capacity(count);
    wires.push(crate::backend::wire(&["MULTI"]));
    wires.extend(tx.wires);
    wires.push(crate::backend::wire(&["EXEC"]));
    // A SELECT inside the transaction changes its connection's database: the transaction
    // then runs on a connection of its own (the watch's, or one that closes after it),
    // never on a shared one.
    let watch = match (watch, tx.select) {
        (None, Some(_)) => {
            let node = tx.node.unwrap_or_else(|| s.ctx().backend.any_node());
            let hs = s.ctx().backend.node(node).handshake(s.proto(), s.db());
            Some(DedicatedWorker::spawn(hs, s.gone(), false))
        }
        (w, _) => w,
    };
    match watch {
        Some(w) => {
            let rx = w.call(wires, count);
            rb.slots.push(if locals.is_empty() {
                Slot::Later(rx)
            } else {
                Slot::LaterThen(
                    rx,
                    Box::new(move |b| crate::proxy::conn::txn::splice(b, &locals)),
                )
            });
            // What the session sends next, on the shared connections, runs after EXEC.
            s.settle_next();
        }
        None => {
            let node = tx.node.unwrap_or_else(|| s.ctx().backend.any_node());
            let mut buf = BytesMut::new();
            for w in &wires {
                buf.extend_from_slice(w);
            }
            let part = push_n(s, rb, node, buf.freeze(), count as u32);
            rb.slots
                .push(Slot::Merge(Box::new(Merge::Exec(part, locals))));
        }
    }
    if let Some(db) = tx.select {
        set_db(s, db);
    }
    let _ = ready_later;
}

/// A command the proxy answers itself, queued in MULTI, run at EXEC: its one reply.
fn run_queued_local(s: &mut Session, req: &Request) -> Bytes {
    let c = match crate::command::classify(req) {
        Ok(c) => c,
        Err(e) => return err_bytes(&e.to_string()),
    };
    let mut scratch = RoundBuilder::new();
    let flow = handle(s, req, &c, &mut scratch);
    if matches!(flow, Flow::Continue) && scratch.jobs.is_empty() && scratch.slots.len() == 1 {
        if let Some(Slot::Ready(b)) = scratch.slots.pop() {
            return b;
        }
    }
    err_bytes(&format!(
        "ERR saltshaker: {} cannot run inside MULTI through the proxy",
        c.spec.fullname()
    ))
}

/// Inside MULTI: check and queue; the client sees +QUEUED (or the error Redis would give).
/// What the proxy answers itself (CLIENT SETNAME, CLIENT ID, AUTH, ...) is queued in the
/// proxy and run at EXEC in its turn, as Redis runs it; a SELECT goes to the node, so the
/// commands after it run in its database there, and moves the client at EXEC.
pub(in crate::proxy) fn queue_in_tx(s: &mut Session, req: &Request, c: &Classified) -> Slot {
    const QUEUED: &[u8] = b"+QUEUED\r\n";
    // Redis's own refusal (SAVE, SHUTDOWN, SYNC, PSYNC), which aborts the EXEC.
    if c.spec.has(flags::NO_MULTI) {
        return s.refuse(err_bytes("ERR Command not allowed inside a transaction"));
    }
    let single = s.ctx().backend.is_single();
    if c.spec.cmd == Cmd::Select && single {
        // Checked as Redis checks it at EXEC: an index out of range is that command's
        // error in EXEC's reply, and the client stays where it is.
        if let Ok(db) = select_index(s, req.arg(1)) {
            s.txn_mut().select_after(db);
        }
    } else if matches!(c.route, Route::Local)
        && !matches!(
            c.spec.cmd,
            Cmd::Ping | Cmd::Echo | Cmd::Info | Cmd::Debug | Cmd::Monitor
        )
    {
        s.txn_mut().queue_local(req.clone());
        return Slot::Ready(Bytes::from_static(QUEUED));
    }
    let allowed = match c.route {
        Route::Keyed | Route::Blocking | Route::Split(_) | Route::AnyNode => true,
        Route::AllNodes(_) | Route::RandomKey | Route::Scan => single,
        // UNWATCH runs on the transaction's node: a watch there ends with EXEC anyway.
        Route::Transaction => c.spec.cmd == Cmd::Unwatch,
        // INFO goes to the transaction's node, which answers it in EXEC's reply.
        // So does DEBUG ERROR (a node started without enable-debug-command refuses it
        // when it is queued there, and EXEC then aborts, as on that node).
        Route::Local => {
            matches!(c.spec.cmd, Cmd::Ping | Cmd::Echo | Cmd::Info | Cmd::Select)
                || (c.spec.cmd == Cmd::Debug
                    && req.argc() == 3
                    && req.arg(1).eq_ignore_ascii_case(b"ERROR"))
        }
        _ => false,
    };
    let node = if allowed {
        keys_node(s, req, c).map(Some)
    } else {
        Ok(None)
    };
    let node = match node {
        Ok(Some(n)) => n,
        Ok(None) => {
            return s.refuse(err_bytes(&format!(
                "ERR saltshaker: {} is not supported inside MULTI through the proxy",
                c.spec.name
            )))
        }
        Err(e) => return s.refuse(e),
    };
    let keyed = (!c.keys.is_empty()).then_some(node);
    let writes = c.keys.iter().map(|&k| req.arg_bytes(k as usize));
    let writes = writes.filter(|_| c.spec.flags & flags::WRITE != 0);
    match s.txn_mut().queue(keyed, req.wire(), writes) {
        Ok(()) => Slot::Ready(Bytes::from_static(QUEUED)),
        Err(m) => {
            let msg = format!(
                "ERR saltshaker: MULTI across nodes is not supported (keys on {} and {})",
                s.ctx().backend.node(m).addr,
                s.ctx().backend.node(node).addr
            );
            s.refuse(err_bytes(&msg))
        }
    }
}
