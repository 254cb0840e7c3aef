//! The proxy's own clients, as `CLIENT LIST`, `CLIENT INFO` and `CLIENT KILL` see them:
//! one entry per connection, in the line format of Redis 7.0's `CLIENT LIST`, each field
//! with its meaning for the proxy's connection (not a node's).
//!
//! A session publishes what changes rarely (name, database, protocol, user, MULTI) when it
//! changes, and what changes per round (last command, idle) with relaxed atomic stores, so
//! the request path pays two stores per round. The registry's lock is taken when a
//! connection opens or closes and when someone lists or kills.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use crate::command::Spec;

/// Every client connection of this process.
#[derive(Default)]
pub struct Clients {
    map: Mutex<BTreeMap<u64, Arc<Client>>>,
}

/// CLIENT PAUSE: until when this proxy's clients wait before their commands run (all of
/// them, or those that write), as Redis pauses its own. One relaxed load per command
/// while nothing is paused.
#[derive(Default)]
pub struct Pause {
    any: AtomicBool,
    state: Mutex<Option<Paused>>,
    changed: tokio::sync::Notify,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paused {
    pub until: Instant,
    /// ALL (every command) rather than WRITE (writes, and commands that may write).
    pub all: bool,
}

impl Pause {
    /// CLIENT PAUSE: as Redis, a pause already on keeps the later end and the stricter
    /// mode.
    pub fn pause(&self, p: Paused) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = match *st {
            Some(old) if old.until > Instant::now() => Paused {
                until: old.until.max(p.until),
                all: old.all || p.all,
            },
            _ => p,
        };
        *st = Some(now);
        self.any.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// CLIENT UNPAUSE.
    pub fn unpause(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.any.store(false, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// The pause a command waits for now (`writes`: it writes or may), if any.
    pub fn holds(&self, writes: bool) -> Option<Instant> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let st = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st {
            Some(p) if p.until > Instant::now() && (p.all || writes) => Some(p.until),
            Some(p) if p.until <= Instant::now() => {
                self.any.store(false, Ordering::Release);
                None
            }
            _ => None,
        }
    }

    /// Waits until a command (`writes` as in `holds`) may run.
    pub async fn wait(&self, writes: bool) {
        while let Some(until) = self.holds(writes) {
            let changed = self.changed.notified();
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

/// What changes rarely: published by the session when it changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shown {
    pub name: String,
    pub db: u32,
    pub resp: u8,
    pub user: String,
    /// Commands queued in MULTI, or None outside one.
    pub multi: Option<usize>,
    /// Bytes those commands hold.
    pub multi_mem: usize,
    /// CLIENT TRACKING is on: the client its invalidations go to (0: itself), and
    /// whether it broadcasts (BCAST).
    pub tracking: Option<(u64, bool)>,
}

/// One client connection.
pub struct Client {
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub fd: i64,
    created: Instant,
    shown: Mutex<Shown>,
    /// Milliseconds after `created` of the last command.
    last_ms: AtomicU64,
    /// The last command's table entry (null before the first).
    last_cmd: std::sync::atomic::AtomicPtr<Spec>,
    /// The read buffer's size after the last read, and the output not yet written.
    rbs: AtomicUsize,
    omem: AtomicUsize,
    blocked: AtomicBool,
    /// While blocked: the node and the node's id of the connection the command waits
    /// on (0 until known), for CLIENT UNBLOCK.
    blocked_on: Mutex<Option<(usize, Arc<AtomicU64>)>>,
    /// Its subscriptions as its node counts them: channels, patterns, shard channels
    /// (CLIENT LIST's `sub`, `psub`, `ssub`), kept by the pub/sub tunnel (`set_subs`).
    subs: [AtomicU32; 3],
    kill: watch::Sender<bool>,
    /// Invalidations for it (client-side caching), pushed by its session.
    pub inbox: Inbox,
}

/// An inbox holding more keys than this is turned into one flush.
const INBOX_MAX_KEYS: usize = 4096;

/// The invalidations waiting for one client.
#[derive(Default)]
pub struct Inbox {
    /// Something is waiting: the session's one check per read while nothing is.
    ready: AtomicBool,
    pending: Mutex<Pending>,
    pub notify: tokio::sync::Notify,
}

#[derive(Default)]
struct Pending {
    /// One `invalidate` message each: one key (default mode), or the keys of one
    /// broadcast prefix (BCAST).
    messages: Vec<Vec<Bytes>>,
    keys: usize,
    flush: bool,
}

impl Inbox {
    pub fn add(&self, key: Bytes) {
        self.add_message(vec![key]);
    }

    pub fn add_message(&self, keys: Vec<Bytes>) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !p.flush {
            if p.keys + keys.len() > INBOX_MAX_KEYS {
                p.messages = Vec::new();
                p.flush = true;
            } else {
                p.keys += keys.len();
                p.messages.push(keys);
            }
        }
        drop(p);
        self.ready.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    pub fn flush(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.messages = Vec::new();
        p.flush = true;
        drop(p);
        self.ready.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// The messages waiting, as Redis writes them: one `invalidate` per key, or one with a
    /// null for everything; RESP3 push messages, or in RESP2 (a client subscribed through
    /// a tunnel, which REDIRECT names) messages of the `__redis__:invalidate` channel.
    pub fn take(&self, resp3: bool) -> Option<Bytes> {
        if !self.ready.swap(false, Ordering::Acquire) {
            return None;
        }
        let p = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if !p.flush && p.messages.is_empty() {
            return None;
        }
        let mut out = bytes::BytesMut::new();
        let head: &[u8] = match resp3 {
            true => b">2\r\n$10\r\ninvalidate\r\n",
            false => b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n",
        };
        if p.flush {
            out.extend_from_slice(head);
            out.extend_from_slice(if resp3 { b"_\r\n" } else { b"$-1\r\n" });
        } else {
            for keys in p.messages {
                out.extend_from_slice(head);
                crate::resp::encode_array_header(keys.len(), &mut out);
                for k in keys {
                    crate::resp::encode_bulk(&k, &mut out);
                }
            }
        }
        Some(out.freeze())
    }
}

/// Which clients a `CLIENT KILL` or `CLIENT LIST` selects (Redis's filters).
#[derive(Default)]
pub struct Filter {
    pub ids: Option<Vec<u64>>,
    pub addr: Option<String>,
    pub laddr: Option<String>,
    pub user: Option<String>,
    /// `normal` or `pubsub` (`master`/`replica` select none: the proxy has none).
    pub kind: Option<String>,
    /// Leave out this client (`SKIPME yes`).
    pub skip: Option<u64>,
}

impl Clients {
    /// Registers a new connection; dropping the returned `Registered` takes it out.
    pub fn open(self: &Arc<Self>, id: u64, addr: &str, laddr: &str, fd: i64) -> Registered {
        let (kill, killed) = watch::channel(false);
        let c = Arc::new(Client {
            id,
            addr: addr.to_string(),
            laddr: laddr.to_string(),
            fd,
            created: Instant::now(),
            shown: Mutex::new(Shown {
                resp: 2,
                user: "default".into(),
                ..Shown::default()
            }),
            last_ms: AtomicU64::new(0),
            last_cmd: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            rbs: AtomicUsize::new(0),
            omem: AtomicUsize::new(0),
            blocked: AtomicBool::new(false),
            blocked_on: Mutex::new(None),
            subs: Default::default(),
            kill,
            inbox: Inbox::default(),
        });
        self.lock().insert(id, c.clone());
        Registered {
            clients: self.clone(),
            client: c,
            killed,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Client>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client with this id, if connected.
    pub fn get(&self, id: u64) -> Option<Arc<Client>> {
        self.lock().get(&id).cloned()
    }

    /// Whether a client with this id is connected.
    pub fn exists(&self, id: i64) -> bool {
        u64::try_from(id).is_ok_and(|id| self.lock().contains_key(&id))
    }

    /// The clients `f` selects, in id order.
    pub fn select(&self, f: &Filter) -> Vec<Arc<Client>> {
        self.lock()
            .values()
            .filter(|c| c.matches(f))
            .cloned()
            .collect()
    }

    /// Ends the connections `f` selects; how many. They leave the registry at once, as a
    /// client Redis kills leaves its list at once: a CLIENT LIST right after never shows
    /// them, though their tasks may take a moment to close the socket.
    pub fn kill(&self, f: &Filter) -> usize {
        let mut map = self.lock();
        let chosen: Vec<u64> = map
            .values()
            .filter(|c| c.matches(f))
            .map(|c| c.id)
            .collect();
        for id in &chosen {
            if let Some(c) = map.remove(id) {
                let _ = c.kill.send(true);
            }
        }
        chosen.len()
    }
}

impl Client {
    fn matches(&self, f: &Filter) -> bool {
        let shown = self.shown();
        f.ids.as_ref().is_none_or(|ids| ids.contains(&self.id))
            && f.addr.as_ref().is_none_or(|a| *a == self.addr)
            && f.laddr.as_ref().is_none_or(|a| *a == self.laddr)
            && f.user.as_ref().is_none_or(|u| *u == shown.user)
            && f.kind.as_ref().is_none_or(|k| match k.as_str() {
                "normal" => !self.subscribed(),
                "pubsub" => self.subscribed(),
                _ => false,
            })
            && f.skip != Some(self.id)
    }

    pub fn shown(&self) -> Shown {
        self.shown.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes what changes rarely (the session calls it when it changed).
    pub fn publish(&self, now: Shown) {
        *self.shown.lock().unwrap_or_else(|p| p.into_inner()) = now;
    }

    /// Blocked in a command (`on`: the node and the node's id of the connection it waits
    /// on, when it waits on a node), or not.
    pub fn set_blocked(&self, on: bool, node: Option<(usize, Arc<AtomicU64>)>) {
        self.blocked.store(on, Ordering::Relaxed);
        *self.blocked_on.lock().unwrap_or_else(|p| p.into_inner()) = node;
    }

    /// Where CLIENT UNBLOCK finds this client's blocked command: its node and the node's
    /// client id, when it waits on a node now.
    pub fn blocked_on(&self) -> Option<(usize, u64)> {
        if !self.blocked.load(Ordering::Relaxed) {
            return None;
        }
        let b = self.blocked_on.lock().unwrap_or_else(|p| p.into_inner());
        b.as_ref()
            .map(|(n, id)| (*n, id.load(Ordering::Acquire)))
            .filter(|(_, id)| *id != 0)
    }

    /// Where it is blocked: None when it is not; `Some(None)` in the proxy itself (CLIENT
    /// PAUSE); `Some(Some((node, id)))` on a node's connection of that id (0 until known).
    pub fn blocked_where(&self) -> Option<Option<(usize, u64)>> {
        if !self.blocked.load(Ordering::Relaxed) {
            return None;
        }
        let b = self.blocked_on.lock().unwrap_or_else(|p| p.into_inner());
        Some(b.as_ref().map(|(n, id)| (*n, id.load(Ordering::Acquire))))
    }

    /// A subscription's confirmation from the node (`subscribe`, `unsubscribe`,
    /// `psubscribe`, ... with the count it gives): the counts CLIENT LIST shows. Redis
    /// gives channels and patterns together in one count, shard channels apart.
    pub fn set_subs(&self, kind: &[u8], count: u32) {
        let (sub, psub) = (&self.subs[0], &self.subs[1]);
        match kind.to_ascii_lowercase().as_slice() {
            b"subscribe" | b"unsubscribe" => sub.store(
                count.saturating_sub(psub.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            ),
            b"psubscribe" | b"punsubscribe" => psub.store(
                count.saturating_sub(sub.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            ),
            b"ssubscribe" | b"sunsubscribe" => self.subs[2].store(count, Ordering::Relaxed),
            _ => return,
        }
        if count == 0
            && !kind.eq_ignore_ascii_case(b"ssubscribe")
            && !kind.eq_ignore_ascii_case(b"sunsubscribe")
        {
            sub.store(0, Ordering::Relaxed);
            psub.store(0, Ordering::Relaxed);
        }
    }

    /// Subscribed to anything: Redis's CLIENT_PUBSUB flag (`P`, `TYPE pubsub`).
    pub fn subscribed(&self) -> bool {
        self.subs.iter().any(|n| n.load(Ordering::Relaxed) > 0)
    }

    /// The reply bytes not yet written to the client.
    pub fn set_output(&self, bytes: usize) {
        self.omem.store(bytes, Ordering::Relaxed);
    }

    /// A round of commands was read at `at` (the read buffer then `rbs` bytes); its last
    /// command is `cmd`.
    pub fn touched(&self, at: Instant, rbs: usize, cmd: &'static Spec) {
        let ms = at.saturating_duration_since(self.created).as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
        self.rbs.store(rbs, Ordering::Relaxed);
        self.last_cmd
            .store(cmd as *const Spec as *mut Spec, Ordering::Relaxed);
    }

    /// The `CLIENT LIST` line of this client, as Redis 7.0 writes it. `current`: the
    /// command being answered, when the line is the asking client's own.
    pub fn line(&self, current: Option<&'static Spec>) -> String {
        let s = self.shown();
        let now = Instant::now();
        let age = now.saturating_duration_since(self.created).as_secs();
        let last = self.last_ms.load(Ordering::Relaxed);
        let idle = match current {
            Some(_) => 0,
            None => {
                (now.saturating_duration_since(self.created).as_millis() as u64)
                    .saturating_sub(last)
                    / 1000
            }
        };
        let cmd = current.or_else(|| {
            let p = self.last_cmd.load(Ordering::Relaxed);
            // Only ever a `&'static Spec` of the command table, stored by `touched`.
            (!p.is_null()).then(|| unsafe { &*p })
        });
        let cmd = cmd.map_or("NULL".to_string(), |c| c.fullname());
        let mut flags = String::new();
        if s.multi.is_some() {
            flags.push('x');
        }
        if self.blocked.load(Ordering::Relaxed) {
            flags.push('b');
        }
        if let Some((_, bcast)) = s.tracking {
            flags.push('t');
            if bcast {
                flags.push('B');
            }
        }
        if self.subscribed() {
            flags.push('P');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        let rbs = self.rbs.load(Ordering::Relaxed);
        let omem = self.omem.load(Ordering::Relaxed);
        let tot = PER_CONNECTION + rbs + omem + s.multi_mem;
        format!(
            "id={} addr={} laddr={} fd={} name={} age={age} idle={idle} flags={flags} db={} \
             sub={} psub={} ssub={} multi={} qbuf=0 qbuf-free={rbs} argv-mem=0 multi-mem={} \
             rbs={rbs} rbp={rbs} obl=0 oll=0 omem={omem} tot-mem={tot} events={} cmd={cmd} \
             user={} redir={} resp={}\n",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            s.name,
            s.db,
            self.subs[0].load(Ordering::Relaxed),
            self.subs[1].load(Ordering::Relaxed),
            self.subs[2].load(Ordering::Relaxed),
            s.multi.map_or(-1, |n| n as i64),
            s.multi_mem,
            if omem > 0 { "rw" } else { "r" },
            s.user,
            s.tracking.map_or(-1, |(r, _)| r as i64),
            s.resp,
        )
    }
}

/// What an open connection holds besides its buffers, measured with idle connections
/// (bench/conn_memory.py): the session's tasks and state.
const PER_CONNECTION: usize = 16 * 1024;

/// A connection's place in the registry, for as long as it is open.
pub struct Registered {
    clients: Arc<Clients>,
    pub client: Arc<Client>,
    /// Turns true when a `CLIENT KILL` selects this connection.
    pub killed: watch::Receiver<bool>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.client.id);
    }
}

/// Why `CLIENT KILL` or `CLIENT LIST` refused its arguments: Redis 7.0's own replies.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("ERR syntax error")]
    Syntax,
    #[error("ERR Invalid client ID")]
    BadId,
    #[error("ERR client-id should be greater than 0")]
    BadKillId,
    #[error("ERR Unknown client type '{0}'")]
    UnknownType(String),
}

/// Parses the filters of `CLIENT LIST` (`args` after LIST) or `CLIENT KILL` (after KILL,
/// the new form), as Redis 7.0 does.
pub fn parse_filter(args: &[&[u8]], me: u64, kill: bool) -> Result<Filter, FilterError> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let kind = |v: &[u8]| {
        let t = text(v).to_ascii_lowercase();
        match t.as_str() {
            "normal" | "pubsub" | "master" | "replica" | "slave" => Ok(t),
            _ => Err(FilterError::UnknownType(text(v))),
        }
    };
    let mut f = Filter {
        skip: kill.then_some(me),
        ..Filter::default()
    };
    if !kill {
        let opt = args.first().map(|a| text(a).to_ascii_lowercase());
        match (opt.as_deref(), args.len()) {
            (None, _) => {}
            (Some("type"), 2) => f.kind = Some(kind(args[1])?),
            (Some("id"), n) if n > 1 => {
                let mut ids = Vec::new();
                for a in &args[1..] {
                    match crate::resp::parse_i64(a) {
                        Some(n) if n > 0 => ids.push(n as u64),
                        _ => return Err(FilterError::BadId),
                    }
                }
                f.ids = Some(ids);
            }
            _ => return Err(FilterError::Syntax),
        }
        return Ok(f);
    }
    let mut i = 0;
    while i < args.len() {
        let opt = text(args[i]).to_ascii_lowercase();
        let Some(v) = args.get(i + 1) else {
            return Err(FilterError::Syntax);
        };
        match opt.as_str() {
            "id" => match crate::resp::parse_i64(v) {
                Some(n) if n > 0 => f.ids = Some(vec![n as u64]),
                _ => return Err(FilterError::BadKillId),
            },
            "type" => f.kind = Some(kind(v)?),
            "addr" => f.addr = Some(text(v)),
            "laddr" => f.laddr = Some(text(v)),
            "user" => f.user = Some(text(v)),
            "skipme" => match text(v).to_ascii_lowercase().as_str() {
                "yes" => f.skip = Some(me),
                "no" => f.skip = None,
                _ => return Err(FilterError::Syntax),
            },
            _ => return Err(FilterError::Syntax),
        }
        i += 2;
    }
    Ok(f)
}
