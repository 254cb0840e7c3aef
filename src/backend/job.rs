//! A job for a node's shared connection (the wire bytes of one or more commands and the
//! oneshot their replies go to), and the replies as the node sent them.

use bytes::Bytes;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::BackendError;

/// Replies to one job: `ends[i]` is where reply `i` ends in `buf`.
#[derive(Debug, Clone)]
pub struct Replies {
    pub buf: Bytes,
    pub ends: SmallVec<[u32; 16]>,
}

impl Replies {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Whether any reply is an error (its first byte is `-`).
    pub fn has_error(&self) -> bool {
        let mut start = 0;
        for &end in &self.ends {
            if self.buf.get(start) == Some(&b'-') {
                return true;
            }
            start = end as usize;
        }
        false
    }

    /// Reply `i` as raw RESP bytes (zero-copy).
    pub fn get(&self, i: usize) -> Bytes {
        self.buf.slice(self.range(i))
    }

    /// Reply `i`, borrowed.
    pub fn get_ref(&self, i: usize) -> &[u8] {
        &self.buf[self.range(i)]
    }

    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        start..self.ends[i] as usize
    }
}

pub type ReplyTx = oneshot::Sender<Result<Replies, BackendError>>;
pub type ReplyRx = oneshot::Receiver<Result<Replies, BackendError>>;

/// Commands for one node, sent as one unit: their bytes are written contiguously, so a
/// `MULTI ... EXEC` job cannot interleave with other sessions' commands.
pub struct Job {
    pub data: SmallVec<[Bytes; 4]>,
    pub count: u32,
    pub tx: ReplyTx,
    /// Sent again after a connection broke with it unanswered: not tried a third time.
    pub(super) again: bool,
}

impl Job {
    pub fn new(data: SmallVec<[Bytes; 4]>, count: u32, tx: ReplyTx) -> Job {
        Job {
            data,
            count,
            tx,
            again: false,
        }
    }

    pub(super) fn fail(self, e: BackendError) {
        let _ = self.tx.send(Err(e));
    }

    /// Whether the job may be sent again after its connection broke with it unanswered:
    /// every command in it only reads (Redis's `readonly` flag, not blocking), one per
    /// buffer. A read run twice answers as once; a write might have run.
    pub(super) fn retry_safe(&self) -> bool {
        self.count > 0
            && self.data.len() == self.count as usize
            && self.data.iter().all(|cmd| {
                command_name(cmd)
                    .and_then(crate::command::lookup)
                    .is_some_and(|spec| {
                        spec.is_read()
                            && !spec.is_write()
                            && !spec.is_container()
                            && !spec.has(crate::command::flags::BLOCKING)
                    })
            })
    }

    pub(super) fn lost(self, node: &str) {
        self.fail(BackendError::Down {
            node: node.to_string(),
            reason: LOST.into(),
        })
    }
}

/// Why a job's caller got no reply: its connection broke with it in flight.
pub(super) const LOST: &str =
    "connection lost before the reply; the command may or may not have run";

/// The name of a command in RESP's request form (`*N\r\n$L\r\nNAME\r\n...`).
fn command_name(wire: &[u8]) -> Option<&[u8]> {
    let rest = wire.strip_prefix(b"*")?;
    let rest = &rest[rest.iter().position(|&b| b == b'\n')? + 1..];
    let rest = rest.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let len: usize = std::str::from_utf8(rest[..nl].strip_suffix(b"\r")?)
        .ok()?
        .parse()
        .ok()?;
    rest.get(nl + 1..nl + 1 + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cmds: &[&[&str]], count: u32) -> Job {
        let data = cmds.iter().map(|c| crate::backend::wire(c)).collect();
        Job::new(data, count, oneshot::channel().0)
    }

    #[test]
    fn only_jobs_of_plain_reads_are_sent_again() {
        assert_eq!(
            command_name(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
            Some(&b"GET"[..])
        );
        assert_eq!(command_name(b"*1\r\n$4\r\nPI"), None);
        assert!(job(&[&["GET", "k"]], 1).retry_safe());
        assert!(job(&[&["GET", "k"], &["hgetall", "h"]], 2).retry_safe());
        assert!(!job(&[&["GET", "k"], &["INCR", "n"]], 2).retry_safe());
        assert!(!job(&[&["BLPOP", "q", "0"]], 1).retry_safe());
        assert!(!job(&[&["CLIENT", "LIST"]], 1).retry_safe());
        // A MULTI sent as one buffer: its commands are not looked into.
        assert!(!job(&[&["GET", "k"]], 3).retry_safe());
        assert!(!job(&[], 0).retry_safe());
    }
}
