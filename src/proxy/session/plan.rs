//! The decide and observe phases of one classified command, for the session loop: what
//! the rules, the hot set and the salt table say to do with it (`policy::decide`, pure),
//! what the hot-key detector is told, and whether it needs a connection of its own.

use crate::command::{Access, Classified, Cmd, Route};
use crate::hotkey::Kind;
use crate::metrics::Class;
use crate::policy::{self, Action};
use crate::resp::Request;

use crate::proxy::conn::state::Session;

/// Whether the command goes on a connection of the session's own (WATCH, EXEC under
/// WATCH, a blocking command) or runs as a task across nodes (SORT with patterns on other
/// nodes, a STORE destination on another node): it leaves once every earlier reply is in.
pub(in crate::proxy) fn own_connection(s: &Session, req: &Request, c: &Classified) -> bool {
    match c.route {
        Route::Blocking => !s.txn().in_multi(),
        Route::Keyed => {
            !s.txn().in_multi()
                && (crate::proxy::act::route::sort_spans_nodes(s, req, c)
                    || crate::proxy::act::route::store_spans_nodes(s, req, c).is_some())
        }
        Route::Transaction => match c.spec.cmd {
            Cmd::Watch => !s.txn().in_multi(),
            Cmd::Exec => s.txn().in_multi() && s.txn().watching(),
            _ => false,
        },
        _ => false,
    }
}

/// The decide phase: what the rules, the hot set and the salt table say to do with the
/// command (`policy::decide`, pure).
pub(in crate::proxy) fn decide(s: &Session, req: &Request, c: &Classified) -> Action {
    let hot = s.ctx().hot.load();
    let table = s.ctx().salt.table.load();
    // No salted key (the common case): the plan looks no further, so skip the clock.
    let now = if table.is_empty() {
        0
    } else {
        crate::salt::now_ms()
    };
    let rules = s.ctx().rules.load();
    let view = policy::SaltView {
        table: &table,
        db: s.db(),
        in_tx: s.txn().in_multi(),
        now_ms: now,
        fresh: now > 0 && s.ctx().salt.fresh(now),
        stale: now > 0 && s.ctx().salt.stale(now),
        rules: &rules,
    };
    policy::decide(c, req, &hot, &view)
}

/// The observe phase: every key of every command feeds the hot-key detector.
pub(in crate::proxy) fn observe(s: &Session, req: &Request, c: &Classified) -> Class {
    let (kind, class) = match c.access {
        Access::Write => (Kind::Write, Class::Write),
        Access::Read => (Kind::Read, Class::Read),
        Access::Other => return Class::Other,
    };
    if s.detects() {
        for &k in &c.keys {
            s.ctx().detector.observe(req.arg(k as usize), kind);
        }
    }
    class
}
