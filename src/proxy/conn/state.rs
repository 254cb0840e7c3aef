//! One client connection's state: what the session handlers (`local`, `route`,
//! `mitigation`, `salted`) read and change, and what they return to the session loop
//! (`Flow`). The ordering rules live in `order`, behind methods.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::{oneshot, watch};

use super::ctx::Ctx;
use super::dedicated::DedicatedWorker;
use super::order::Order;
use super::tunnel;
use crate::backend::{ConnHandle, Lane};
use crate::command::Classified;
use crate::command::Cmd;
use crate::policy::Action;
use crate::proxy::registry::clients::{Client, Shown};
use crate::resp::{encode_error, Proto, Request};

use super::txn::Txn;

/// A parsed request is what `command` classifies: its arguments by index.
impl crate::command::Args for Request {
    fn argc(&self) -> usize {
        Request::argc(self)
    }
    fn arg(&self, i: usize) -> &[u8] {
        Request::arg(self, i)
    }
    fn arg_bytes(&self, i: usize) -> bytes::Bytes {
        Request::arg_bytes(self, i)
    }
}

/// Per-connection state, owned by the reader.
pub struct Session {
    /// What every session shares (`ctx`).
    ctx: Arc<Ctx>,
    id: u64,
    peer: String,
    local: String,
    /// The protocol and database of the session's commands (`switch_to` changes them).
    proto: Proto,
    db: u32,
    /// CLIENT SETNAME's name (`name`, `set_name`).
    name: Option<Bytes>,
    /// The user logged in as; None until the connection logs in (when it must).
    user: Option<Arc<crate::auth::User>>,
    /// `Users::epoch` when `user` was last looked up: an ACL SETUSER since then applies
    /// at the next command.
    users_epoch: u64,
    /// MULTI's queue and the WATCH held on a node (`txn`).
    txn: Txn,
    blocking: Vec<(usize, DedicatedWorker)>,
    /// Each node's shared connections in this session's protocol and database, looked up
    /// once (`conn`).
    conns: Vec<Option<Arc<[ConnHandle]>>>,
    /// The rotation over a node's connections.
    rr: usize,
    /// The lane of the commands last sent to nodes (`backend::Lane`): scripts travel on
    /// one of their own.
    lane: Lane,
    /// What must be done before the session's next command leaves (see `order`).
    pub(in crate::proxy) order: Order,
    gone: watch::Receiver<bool>,
    /// `detection.enabled` of the rules, read once per round rather than per command
    /// (`begin_round`).
    detect: bool,
    /// Some rule has an `admit:` section, read once per round as `detect`.
    admit: bool,
    /// Some key may be combined or salted: the keys of this round's commands are kept for
    /// the ordering rules (`Order`). Read once per round as `detect`.
    track: bool,
    /// The command just handled went on a connection of its own (WATCH, EXEC under
    /// WATCH): the next one waits until its reply is in (`settle_next`).
    settle_after: bool,
    /// CLIENT REPLY: which replies the client is not sent (`Quiet`).
    quiet: Quiet,
    /// The commands sent whose replies the writer has not taken (`round::Inflight`).
    pub(in crate::proxy) inflight: Arc<super::round::Inflight>,
    /// This connection as CLIENT LIST shows it, and what was last published there.
    pub(in crate::proxy) me: Arc<Client>,
    shown: ShownKey,
    /// CLIENT TRACKING, when on (`client_cache`).
    pub(in crate::proxy) tracking: Option<Box<crate::proxy::registry::tracking::Tracking>>,
}

/// CLIENT REPLY's state, as Redis keeps it in the client's flags.
#[derive(Default, Clone, Copy)]
struct Quiet {
    /// CLIENT REPLY OFF.
    off: bool,
    /// CLIENT REPLY SKIP was the command just run.
    skip_next: bool,
    /// The command now running is the one after CLIENT REPLY SKIP.
    skip_this: bool,
}

/// What CLIENT LIST shows of a session that changes rarely, compared cheaply once per
/// round: database, protocol, the name's and the user's identity, MULTI's length.
type ShownKey = (
    u32,
    Proto,
    Option<(usize, usize)>,
    usize,
    Option<usize>,
    Option<(u64, bool)>,
);

impl Session {
    pub fn new(
        ctx: Arc<Ctx>,
        me: Arc<Client>,
        peer: String,
        local: String,
        gone: watch::Receiver<bool>,
    ) -> Session {
        Session {
            users_epoch: ctx.users.epoch(),
            user: ctx.users.initial(),
            conns: vec![None; ctx.backend.len()],
            ctx,
            id: me.id,
            me,
            shown: (0, Proto::Resp2, None, 0, None, None),
            tracking: None,
            peer,
            local,
            proto: Proto::Resp2,
            db: 0,
            name: None,
            txn: Txn::default(),
            blocking: Vec::new(),
            rr: 0,
            lane: Lane::Main,
            order: Order::default(),
            gone,
            detect: true,
            admit: false,
            track: false,
            settle_after: false,
            quiet: Quiet::default(),
            inflight: Arc::default(),
        }
    }

    pub fn proto(&self) -> Proto {
        self.proto
    }

    pub fn db(&self) -> u32 {
        self.db
    }

    /// The session's commands go in `proto` and database `db` from now on. True if that
    /// is a change: the node connections looked up for the old ones are forgotten here
    /// (the caller drops its dedicated ones).
    pub fn switch_to(&mut self, proto: Proto, db: u32) -> bool {
        if (proto, db) == (self.proto, self.db) {
            return false;
        }
        self.proto = proto;
        self.db = db;
        self.reset_conns();
        true
    }

    /// The logged-in user as the proxy's users say now (ACL SETUSER may have changed it;
    /// ACL DELUSER may have removed it).
    pub fn refresh_user(&mut self) {
        let epoch = self.ctx.users.epoch();
        if epoch != self.users_epoch {
            self.users_epoch = epoch;
            if let Some(u) = &self.user {
                self.user = self.ctx.users.get(u.name.as_bytes());
            }
        }
    }

    /// Records a refusal in ACL LOG: `reason`, `object` for the user `user`.
    pub fn log_refusal(&self, reason: &'static str, object: String, user: &str) {
        let context = if self.txn.in_multi() {
            "multi"
        } else {
            "toplevel"
        };
        let info = self.me.line(None);
        self.ctx.acl_log.add(reason, context, object, user, info);
    }

    /// The shared connection to `node` the next job of this session goes on: the
    /// session's rotation over the node's connections in its protocol and database.
    pub fn conn(&mut self, node: usize) -> ConnHandle {
        let (proto, db, lane) = (self.proto, self.db, self.lane);
        let ctx = &self.ctx;
        // A tracking client's commands go where the node tracks its reads for the proxy.
        // (Broadcasting clients are told of writes, not reads: theirs go as anyone's.)
        let pushes = |t: &crate::proxy::registry::tracking::Tracking| {
            t.prefixes.is_none() && (proto == Proto::Resp3 || t.redirect != 0)
        };
        if self.tracking.as_deref().is_some_and(pushes) {
            if let Some(c) = ctx.tracking.conn(node, proto, db) {
                return c;
            }
        }
        if node >= self.conns.len() {
            // A cluster node added since this session started.
            self.conns.resize(node + 1, None);
        }
        let conns = self.conns[node]
            .get_or_insert_with(|| ctx.backend.node(node).conns_in(proto, db, lane));
        self.rr = self.rr.wrapping_add(1);
        crate::backend::pick(conns, self.rr)
    }

    /// The lane a command on a node takes: scripts and functions their own. True when
    /// it differs from the last one: the session must then let everything it sent
    /// arrive before the command leaves (two connections are not ordered at the node).
    pub fn switch_lane(&mut self, cmd: Cmd) -> bool {
        let lane = match cmd {
            Cmd::Eval | Cmd::Evalsha | Cmd::EvalRo | Cmd::EvalshaRo | Cmd::Fcall | Cmd::FcallRo => {
                Lane::Scripts
            }
            _ => Lane::Main,
        };
        if lane == self.lane {
            return false;
        }
        self.lane = lane;
        self.reset_conns();
        true
    }

    /// Publishes the connection's state to its CLIENT LIST entry, if it changed since the
    /// last time (a few comparisons per round otherwise).
    pub fn publish(&mut self) {
        let key: ShownKey = (
            self.db,
            self.proto,
            self.name.as_ref().map(|n| (n.as_ptr() as usize, n.len())),
            self.user.as_ref().map_or(0, |u| Arc::as_ptr(u) as usize),
            self.txn.queued().map(|q| q.0),
            self.tracking
                .as_ref()
                .map(|t| (t.redirect, t.prefixes.is_some())),
        );
        if key == self.shown {
            return;
        }
        self.shown = key;
        self.me.publish(Shown {
            name: self
                .name
                .as_ref()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_default(),
            db: self.db,
            resp: if self.proto == Proto::Resp3 { 3 } else { 2 },
            user: self
                .user
                .as_ref()
                .map_or_else(|| "default".to_string(), |u| u.name.clone()),
            multi: self.txn.queued().map(|q| q.0),
            multi_mem: self.txn.queued().map_or(0, |q| q.1),
            tracking: self
                .tracking
                .as_ref()
                .map(|t| (t.redirect, t.prefixes.is_some())),
        });
    }

    /// The reply to a command refused before it runs (unknown, not allowed, over a limit,
    /// not possible through the proxy). Inside MULTI it also aborts the EXEC, as Redis
    /// does: the one place a transaction is marked so.
    pub fn refuse(&mut self, reply: Bytes) -> super::round::Slot {
        self.txn.abort();
        super::round::Slot::Ready(reply)
    }

    /// The connection's id (CLIENT ID).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The client's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The proxy's address the client connected to.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// Turns true when the client has gone: dedicated connections end with it.
    pub fn gone(&self) -> watch::Receiver<bool> {
        self.gone.clone()
    }

    /// What every session shares.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The name CLIENT SETNAME (or HELLO SETNAME) gave the connection.
    pub fn name(&self) -> Option<&Bytes> {
        self.name.as_ref()
    }

    /// CLIENT SETNAME, HELLO SETNAME and RESET (None).
    pub fn set_name(&mut self, name: Option<Bytes>) {
        self.name = name;
    }

    /// The user the connection is logged in as; None until it logs in (when it must).
    pub fn user(&self) -> Option<&Arc<crate::auth::User>> {
        self.user.as_ref()
    }

    /// AUTH, HELLO AUTH and RESET: the user from now on (an ACL change is still applied at
    /// the next command, `refresh_user`).
    pub fn log_in(&mut self, user: Option<Arc<crate::auth::User>>) {
        self.user = user;
    }

    /// Reads what a round's commands ask of the rules and of the mitigation state once,
    /// before the round, rather than once per command.
    pub fn begin_round(&mut self) {
        let rules = self.ctx.rules.snapshot();
        self.detect = rules.detection().enabled;
        self.admit = rules.any_admit();
        self.track = !self.ctx.salt.table.load().is_empty() || self.ctx.hot.load().may_combine();
    }

    /// Whether the detector counts this round's keys.
    pub fn detects(&self) -> bool {
        self.detect
    }

    /// Whether some rule has an `admit:` section.
    pub fn admits(&self) -> bool {
        self.admit
    }

    /// Whether some key may be combined or salted: the round's keys are kept for the
    /// ordering rules.
    pub fn tracks_keys(&self) -> bool {
        self.track
    }

    /// The command just handled went on a connection of its own: the next one waits until
    /// its reply is in.
    pub fn settle_next(&mut self) {
        self.settle_after = true;
    }

    /// CLIENT REPLY OFF (`off`) or ON: from the next command on, replies are dropped or
    /// written again.
    pub fn set_reply_off(&mut self, off: bool) {
        self.quiet.off = off;
        if !off {
            self.quiet.skip_this = false;
            self.quiet.skip_next = false;
        }
    }

    /// CLIENT REPLY SKIP: the next command's reply is dropped.
    pub fn skip_next_reply(&mut self) {
        // Redis ignores SKIP while replies are OFF.
        self.quiet.skip_next = !self.quiet.off;
    }

    /// Whether the command about to run has its reply dropped (CLIENT REPLY OFF, or the
    /// command after CLIENT REPLY SKIP).
    pub fn reply_quiet(&self) -> bool {
        self.quiet.off || self.quiet.skip_this
    }

    /// A command ran: a SKIP it asked for applies to the next command, and one that
    /// applied to it is spent (Redis's CLIENT_REPLY_SKIP_NEXT and CLIENT_REPLY_SKIP).
    pub fn reply_ran(&mut self) {
        self.quiet.skip_this = std::mem::take(&mut self.quiet.skip_next);
    }

    /// Whether the command before asked the next one to wait (`settle_next`); clears it.
    pub fn take_settle(&mut self) -> bool {
        std::mem::take(&mut self.settle_after)
    }

    /// The transaction state: MULTI's queue and the WATCH.
    pub fn txn(&self) -> &Txn {
        &self.txn
    }

    /// The transaction state, to change by its own rules (`Txn`'s methods).
    pub fn txn_mut(&mut self) -> &mut Txn {
        &mut self.txn
    }

    /// Forgets the connections looked up, and the dedicated ones, after a protocol or
    /// database change.
    pub fn reset_conns(&mut self) {
        for c in self.conns.iter_mut() {
            *c = None;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.tracking.is_some() {
            self.ctx.tracking.leave(self.id);
        }
    }
}

/// What the reader does after a command.
pub enum Flow {
    Continue,
    Close,
    /// SUBSCRIBE: the client talks to the node from now on (boxed: a `Start` is 112 bytes,
    /// and every read's future holds a `Flow`).
    Tunnel(Box<tunnel::Start>),
    /// MONITOR: the connection streams every command of this proxy from now on.
    Monitor,
    /// Send the round built so far and wait for its replies before this command: it
    /// names a salted key and runs as a task, which must not overtake earlier commands.
    Flush(Box<Decided>),
    /// Send the round built so far, wait until every earlier reply is in, then handle
    /// this command: it takes another connection to its node (a script's lane,
    /// `Session::switch_lane`; WATCH's or a blocking command's own).
    Settle(Box<Pending>),
    /// Wait (for a fill, a salted key's task, a subscription's connection), then go on
    /// with the command where it stopped (`handle::resume`).
    Wait(Box<Paused>),
}

/// A command stopped on its way by a wait (`Flow::Wait`), with what it goes on with.
pub struct Paused {
    pub req: Request,
    pub c: Classified,
    pub cost: Option<super::cost::Cost>,
    /// The round's slots before the command, for its cost note.
    pub before: usize,
    pub wait: Wait,
}

/// What a paused command waits for.
pub enum Wait {
    /// Fills of its keys in flight (a write after a cached read's miss): then the rest of
    /// the write's path.
    Fills(Action),
    /// A fold of the salted keys in the table before a command that needs their whole
    /// value (`salted::fold_first`); the action is what the command does then (the plan's
    /// `then`). Boxed: every stage of the synchronous path returns a `Result<Flow, Wait>`.
    Fold(Box<(Arc<crate::salt::SaltTable>, Action)>),
    /// A subscription: its own connection to the node, opened.
    Subscribe(usize),
}

/// A classified command waiting for the session's earlier replies before it is decided.
pub struct Pending {
    pub req: Request,
    pub c: Classified,
}

/// A decided command waiting for the round built before it to leave.
pub struct Decided {
    pub req: Request,
    pub c: Classified,
    pub action: Action,
}

pub fn err_bytes(msg: &str) -> Bytes {
    let mut out = BytesMut::new();
    encode_error(msg, &mut out);
    out.freeze()
}

/// The session's dedicated connection to `node` for blocking commands, opened on first use.
pub(in crate::proxy) fn blocking_worker(s: &mut Session, node: usize) -> &DedicatedWorker {
    if let Some(i) = s.blocking.iter().position(|(n, _)| *n == node) {
        return &s.blocking[i].1;
    }
    let hs = s.ctx.backend.node(node).handshake(s.proto, s.db);
    s.blocking
        .push((node, DedicatedWorker::spawn(hs, s.gone.clone(), true)));
    &s.blocking.last().expect("just pushed").1
}

/// Drops dedicated connections that were opened for another protocol or database.
pub fn reset_dedicated(s: &mut Session) {
    s.blocking.clear();
    s.txn.forget_watch();
}

/// A oneshot already answered with `bytes`.
pub fn ready_later(bytes: Bytes) -> oneshot::Receiver<Bytes> {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(bytes);
    rx
}
