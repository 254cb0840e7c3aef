//! ACL LOG: the commands and logins the proxy refused, newest first, grouped as Redis
//! groups them (the same reason, context, object and user within 60 s add to one entry's
//! count), at most 128 entries (Redis's `acllog-max-len` default).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MAX_ENTRIES: usize = 128;
const GROUPING: Duration = Duration::from_secs(60);

/// One refusal, as ACL LOG shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub count: u64,
    /// `command`, `key`, `channel` or `auth`.
    pub reason: &'static str,
    /// `toplevel` or `multi`.
    pub context: &'static str,
    pub object: String,
    pub username: String,
    /// The client's CLIENT LIST line when it was last refused.
    pub client_info: String,
    pub created: Instant,
    pub updated: Instant,
}

#[derive(Debug, Default)]
pub struct Log {
    entries: Mutex<VecDeque<Entry>>,
}

impl Log {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a refusal.
    pub fn add(
        &self,
        reason: &'static str,
        context: &'static str,
        object: String,
        username: &str,
        client_info: String,
    ) {
        let now = Instant::now();
        let mut e = self.lock();
        let same = e.iter().position(|x| {
            x.reason == reason
                && x.context == context
                && x.object == object
                && x.username == username
                && now.duration_since(x.updated) < GROUPING
        });
        if let Some(i) = same {
            let mut x = e.remove(i).expect("found above");
            x.count += 1;
            x.updated = now;
            x.client_info = client_info;
            e.push_front(x);
            return;
        }
        e.push_front(Entry {
            count: 1,
            reason,
            context,
            object,
            username: username.to_string(),
            client_info,
            created: now,
            updated: now,
        });
        e.truncate(MAX_ENTRIES);
    }

    /// The newest `n` entries (all with None).
    pub fn newest(&self, n: Option<usize>) -> Vec<Entry> {
        let e = self.lock();
        e.iter().take(n.unwrap_or(usize::MAX)).cloned().collect()
    }

    /// ACL LOG RESET.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_refusal_adds_to_one_entry_and_the_newest_comes_first() {
        let log = Log::default();
        log.add("key", "toplevel", "k".into(), "u", "id=1".into());
        log.add("command", "toplevel", "hset".into(), "u", "id=1".into());
        log.add("key", "toplevel", "k".into(), "u", "id=2".into());
        let e = log.newest(None);
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].reason, e[0].count, e[0].client_info.as_str()),
            ("key", 2, "id=2")
        );
        assert_eq!(e[1].object, "hset");
        assert_eq!(log.newest(Some(1)).len(), 1);
        for i in 0..200 {
            log.add("key", "toplevel", format!("k{i}"), "u", String::new());
        }
        assert_eq!(log.newest(None).len(), MAX_ENTRIES);
        log.clear();
        assert!(log.newest(None).is_empty());
    }
}
