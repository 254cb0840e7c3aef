//! The display tier of a salted counter's merged reads (`read.salted.tier: display`): a
//! rollup of the merged value, refreshed by at most one merged read per `refresh_ms` on
//! each proxy (single-flight: readers that find it too old while a refresh runs wait for
//! that refresh), so a read costs about what a cached GET costs.
//!
//! What a reader sees was merged no longer than `refresh_ms` ago (counted from when the
//! merge was sent), plus the time of one merge. This proxy's own increments acknowledged
//! since that merge was sent are added to what it shows, so a client reads its own writes;
//! an increment acknowledged while the merge was on its way may be shown twice until the
//! next refresh (the merge may have counted it too). Each key holds one rollup per field
//! read (at most `MAX_FIELDS`), and only those fields' increments are noted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use crate::resp::Value;

/// Fields of one hash with a rollup; reads of more fields are merged exactly.
pub const MAX_FIELDS: usize = 1024;

type Done = Option<Result<Value, Value>>;

/// Longer than any merge may take (every node call of salting gives up within its
/// deadline, five seconds at most by default).
const ABANDONED: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Rollups {
    /// Some rollup exists: writes must note their increments (one load when none does).
    any: AtomicBool,
    fields: Mutex<HashMap<Option<Bytes>, Rollup>>,
}

struct Rollup {
    /// The last merged value, when that merge was sent, and `own` then.
    value: Option<(Value, Instant, i64)>,
    /// This proxy's increments acknowledged so far.
    own: i64,
    /// The refresh on its way, if any: its readers wait on it.
    refresh: Option<(watch::Receiver<Done>, Instant, i64)>,
}

/// What a read of the rollup does.
pub enum Lookup {
    /// Fresh enough: the reply at once.
    Fresh(Value),
    /// Too old, and a refresh is on its way: wait for it (`wait`).
    Wait(watch::Receiver<Done>),
    /// Too old: this reader runs the merge, then hands the result to `Ticket::done`.
    Refresh(Ticket),
    /// Not kept (too many fields): merge exactly.
    Exact,
}

/// The right (and duty) to refresh one rollup.
pub struct Ticket {
    field: Option<Bytes>,
    tx: watch::Sender<Done>,
}

impl Rollups {
    pub fn lookup(&self, field: Option<&Bytes>, refresh: Duration, now: Instant) -> Lookup {
        let mut fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        if !fields.contains_key(&field.cloned()) && fields.len() >= MAX_FIELDS {
            return Lookup::Exact;
        }
        self.any.store(true, Ordering::Release);
        let r = fields.entry(field.cloned()).or_insert(Rollup {
            value: None,
            own: 0,
            refresh: None,
        });
        if let Some((v, at, own_then)) = &r.value {
            if now.saturating_duration_since(*at) < refresh {
                return Lookup::Fresh(add(v, r.own - own_then));
            }
        }
        // A refresh whose reader went away (its session closed mid-merge) never ends:
        // past `ABANDONED` the next reader starts another.
        if let Some((rx, started, _)) = &r.refresh {
            if now.saturating_duration_since(*started) < ABANDONED {
                return Lookup::Wait(rx.clone());
            }
        }
        let (tx, rx) = watch::channel(None);
        r.refresh = Some((rx, now, r.own));
        Lookup::Refresh(Ticket {
            field: field.cloned(),
            tx,
        })
    }

    /// This proxy's increment of `field` by `delta` was acknowledged.
    pub fn wrote(&self, field: Option<&Bytes>, delta: i64) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = fields.get_mut(&field.cloned()) {
            r.own = r.own.saturating_add(delta);
        }
    }

    /// A write this proxy could not count (one the base key took as a plain command):
    /// the next read merges again.
    pub fn stale(&self) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        for r in fields.values_mut() {
            r.value = None;
        }
    }

    /// Ends a refresh: keeps the merged value (not an error) and answers its waiters.
    pub fn done(&self, t: Ticket, merged: Result<Value, Value>) -> Value {
        let mut fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        let shown = match fields.get_mut(&t.field) {
            Some(r) => {
                let (_, sent, own_then) =
                    r.refresh
                        .take()
                        .unwrap_or((t.tx.subscribe(), Instant::now(), r.own));
                match &merged {
                    Ok(v) => {
                        r.value = Some((v.clone(), sent, own_then));
                        Ok(add(v, r.own - own_then))
                    }
                    Err(e) => Err(e.clone()),
                }
            }
            None => merged,
        };
        let _ = t.tx.send(Some(shown.clone()));
        shown.unwrap_or_else(|e| e)
    }
}

/// Waits for the refresh a reader found on its way.
pub async fn wait(mut rx: watch::Receiver<Done>) -> Value {
    loop {
        if let Some(r) = rx.borrow_and_update().clone() {
            return r.unwrap_or_else(|e| e);
        }
        if rx.changed().await.is_err() {
            // The refresher went away without an answer (its task ended early).
            return Value::Error(Bytes::from_static(
                b"ERR saltshaker: the display-tier refresh of this key did not finish; retry",
            ));
        }
    }
}

/// A merged counter reply (`$n`, or nil for an absent key) plus `d`.
fn add(v: &Value, d: i64) -> Value {
    if d == 0 {
        return v.clone();
    }
    let base = match v {
        Value::Nil => Some(0),
        Value::Bulk(b) => crate::resp::parse_i64(b),
        Value::Integer(i) => Some(*i),
        _ => None,
    };
    match base.and_then(|b| b.checked_add(d)) {
        Some(n) => Value::Bulk(Bytes::from(n.to_string())),
        None => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(n: i64) -> Value {
        Value::Bulk(Bytes::from(n.to_string()))
    }

    #[test]
    fn one_refresh_per_period_and_own_writes_are_shown() {
        let r = Rollups::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        r.wrote(None, 5); // before any rollup: not noted
        let Lookup::Refresh(t) = r.lookup(None, ms(100), t0) else {
            panic!("the first read refreshes")
        };
        // A second reader while the first merge runs waits for it.
        let Lookup::Wait(rx) = r.lookup(None, ms(100), t0) else {
            panic!("single flight")
        };
        assert_eq!(r.done(t, Ok(bulk(40))), bulk(40));
        assert_eq!(rx.borrow().clone(), Some(Ok(bulk(40))));
        // Fresh: served without a merge, with this proxy's increments since.
        r.wrote(None, 2);
        match r.lookup(None, ms(100), t0 + ms(50)) {
            Lookup::Fresh(v) => assert_eq!(v, bulk(42)),
            _ => panic!("fresh"),
        }
        // Too old: refresh again; what was added is now in the merge.
        let Lookup::Refresh(t) = r.lookup(None, ms(100), t0 + ms(100)) else {
            panic!("stale")
        };
        assert_eq!(r.done(t, Ok(bulk(45))), bulk(45));
        // An error is passed on and not kept.
        r.stale();
        let Lookup::Refresh(t) = r.lookup(None, ms(100), t0 + ms(120)) else {
            panic!("a base write drops the rollup")
        };
        let e = Value::Error(Bytes::from_static(b"ERR down"));
        assert_eq!(r.done(t, Err(e.clone())), e);
        assert!(matches!(
            r.lookup(None, ms(100), t0 + ms(121)),
            Lookup::Refresh(_)
        ));
        // An absent key shows only what this proxy added.
        assert_eq!(add(&Value::Nil, 3), bulk(3));
        assert_eq!(add(&Value::Nil, 0), Value::Nil);
    }
}
