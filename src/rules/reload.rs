//! Live rules: a lock-free snapshot for the data path, and the task that reloads the file on
//! SIGHUP or when it changes (parse -> validate -> swap; a bad file keeps the old rules).
//!
//! Change detection polls the file's mtime, length and inode every `POLL_INTERVAL` rather
//! than using inotify: no extra dependency, and it also sees the symlink swap Kubernetes
//! does when a ConfigMap changes (the inode behind the path changes).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Rules;

/// How often the reloader looks at the file.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The live rules. Cloning is cheap; every clone sees the same rules.
#[derive(Clone)]
pub struct RulesHandle {
    current: Arc<ArcSwap<Rules>>,
    generation: Arc<watch::Sender<u64>>,
    /// The latest reload attempt failed (the previous rules are still in force).
    last_failed: Arc<std::sync::atomic::AtomicBool>,
}

impl RulesHandle {
    pub fn new(r: Rules) -> Self {
        let (tx, _) = watch::channel(0);
        RulesHandle {
            current: Arc::new(ArcSwap::from_pointee(r)),
            generation: Arc::new(tx),
            last_failed: Arc::default(),
        }
    }

    /// Whether the latest reload attempt failed; cleared by the next successful one.
    pub fn last_reload_failed(&self) -> bool {
        self.last_failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set_last_reload_failed(&self, failed: bool) {
        self.last_failed
            .store(failed, std::sync::atomic::Ordering::Relaxed);
    }

    /// The current rules; keep the `Arc` for as long as one decision needs a stable view.
    pub fn load(&self) -> Arc<Rules> {
        self.current.load_full()
    }

    /// Cheaper than `load` for a short look (no reference-count traffic on the hot path).
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Rules>> {
        self.current.load()
    }

    /// Ticks with a new generation number each time the rules change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Swaps in `r` and announces it; returns the new generation.
    pub fn store(&self, r: Rules) -> u64 {
        self.current.store(Arc::new(r));
        self.generation.send_modify(|g| *g += 1);
        self.generation()
    }
}

/// Reloads `path` into `handle` on SIGHUP and whenever the file changes. Each attempt
/// counts in `reloads_ok` or `reloads_failed`; a failure logs the file, line, column and
/// field at warn and leaves the running rules alone. Call from within the runtime: the
/// SIGHUP handler is in place when this returns.
pub fn spawn_reloader(
    path: PathBuf,
    handle: RulesHandle,
    reloads_ok: Counter,
    reloads_failed: Counter,
) -> JoinHandle<()> {
    let hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; rules reload on file change only");
            None
        }
    };
    spawn_with(path, handle, reloads_ok, reloads_failed, POLL_INTERVAL, hup)
}

fn spawn_with(
    path: PathBuf,
    handle: RulesHandle,
    ok: Counter,
    failed: Counter,
    poll: Duration,
    mut hup: Option<Signal>,
) -> JoinHandle<()> {
    let mut r = Reloader {
        seen: Stamp::of(&path),
        path,
        handle,
        ok,
        failed,
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = Stamp::of(&r.path);
                    if now != r.seen {
                        r.seen = now;
                        r.reload("file changed");
                    }
                }
                got = next_hup(&mut hup) => match got {
                    Some(()) => {
                        r.seen = Stamp::of(&r.path);
                        r.reload("SIGHUP");
                    }
                    None => hup = None,
                },
            }
        }
    })
}

async fn next_hup(hup: &mut Option<Signal>) -> Option<()> {
    match hup {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// What the poll compares: a rewrite, a truncation or a replaced file all change it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl Stamp {
    /// `None` when the file cannot be seen (deleted, mid-rename): a change like any other.
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            modified: m.modified().ok(),
            len: m.len(),
            inode: m.ino(),
        })
    }
}

struct Reloader {
    path: PathBuf,
    handle: RulesHandle,
    ok: Counter,
    failed: Counter,
    seen: Option<Stamp>,
}

impl Reloader {
    /// Parse -> validate -> swap. The file is small and read at most twice a second, so a
    /// blocking read here costs less than a trip to the blocking pool.
    fn reload(&mut self, why: &str) {
        let file = self.path.display().to_string();
        match Rules::load(&self.path) {
            Ok(new) => {
                self.ok.inc();
                self.handle.set_last_reload_failed(false);
                if *self.handle.snapshot().as_ref() == new {
                    tracing::debug!(%file, why, "rules reloaded, unchanged");
                    return;
                }
                let n = new.rules().len();
                let generation = self.handle.store(new);
                tracing::info!(%file, why, rules = n, generation, "rules reloaded");
            }
            Err(e) => {
                self.failed.inc();
                self.handle.set_last_reload_failed(true);
                tracing::warn!(error = %e, why, "rules reload failed; keeping the previous rules");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        "version: 1\nrules:\n  - match: \"likes:*\"\n    write: { strategy: salt }\n";
    const BAD: &str =
        "version: 1\nrules:\n  - match: \"likes:*\"\n    write: { strategyy: salt }\n";
    const FIXED: &str =
        "version: 1\nrules:\n  - match: \"likes:*\"\n    write: { strategy: combine }\n";

    fn temp_file(name: &str, text: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("saltshaker-rules-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("rules.yaml");
        std::fs::write(&p, text).unwrap();
        p
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let start = tokio::time::Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn bad_file_keeps_old_rules_and_fixed_file_is_swapped_in() {
        let path = temp_file("poll", GOOD);
        let handle = RulesHandle::new(Rules::load(&path).unwrap());
        let before = handle.load();
        let mut gen = handle.subscribe();
        let (ok, failed) = (Counter::default(), Counter::default());
        let task = spawn_with(
            path.clone(),
            handle.clone(),
            ok.clone(),
            failed.clone(),
            Duration::from_millis(20),
            None,
        );

        std::fs::write(&path, BAD).unwrap();
        until("failure counted", || failed.get() == 1).await;
        assert_eq!(handle.load(), before);
        assert_eq!((ok.get(), handle.generation()), (0, 0));
        assert!(handle.last_reload_failed());

        std::fs::write(&path, FIXED).unwrap();
        until("success counted", || ok.get() == 1).await;
        gen.changed().await.unwrap();
        assert_eq!(*gen.borrow(), 1);
        assert_eq!(
            handle.load().resolve(b"likes:1").write.strategy,
            super::super::Strategy::Combine
        );
        assert_eq!(failed.get(), 1);
        assert!(
            !handle.last_reload_failed(),
            "a good reload clears the failure"
        );
        task.abort();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn deleted_file_counts_one_failure_and_keeps_rules() {
        let path = temp_file("gone", GOOD);
        let handle = RulesHandle::new(Rules::load(&path).unwrap());
        let (ok, failed) = (Counter::default(), Counter::default());
        let task = spawn_with(
            path.clone(),
            handle.clone(),
            ok.clone(),
            failed.clone(),
            Duration::from_millis(20),
            None,
        );
        std::fs::remove_file(&path).unwrap();
        until("failure counted", || failed.get() == 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!((failed.get(), handle.generation()), (1, 0));
        task.abort();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn sighup_reloads_without_waiting_for_the_poll() {
        let path = temp_file("hup", GOOD);
        let handle = RulesHandle::new(Rules::load(&path).unwrap());
        let (ok, failed) = (Counter::default(), Counter::default());
        // The handler is installed before the signal is sent, so the test process survives.
        let hup = signal(SignalKind::hangup()).unwrap();
        let task = spawn_with(
            path.clone(),
            handle.clone(),
            ok.clone(),
            failed.clone(),
            Duration::from_secs(3600),
            Some(hup),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::write(&path, FIXED).unwrap();
        // The shell's own `kill`: no dependency on a separate kill binary being installed.
        let sent = std::process::Command::new("sh")
            .args(["-c", &format!("kill -HUP {}", std::process::id())])
            .status()
            .unwrap();
        assert!(sent.success());
        until("reload on SIGHUP", || ok.get() >= 1).await;
        assert_eq!(
            handle.load().resolve(b"likes:x").write.strategy,
            super::super::Strategy::Combine
        );
        assert_eq!(failed.get(), 0);
        task.abort();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
