//! Zero-downtime upgrade: the running process hands its listening sockets to a new one.
//!
//! The old process (started with `--upgrade-socket PATH`) waits on a Unix socket. A new
//! process started with `--upgrade --upgrade-socket PATH` connects, receives the client and
//! admin listening sockets with SCM_RIGHTS, starts accepting on them, and says so. The old
//! process then stops accepting and drains. Because both processes hold the *same* socket,
//! no connection waiting in the accept queue is lost, unlike two SO_REUSEPORT listeners
//! where closing one resets the connections queued on it.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

const HELLO: &[u8] = b"saltshaker-upgrade-1";
const TAKEN: u8 = b'T';

/// Old side: waits for a successor, hands it `fds`, and returns once it says it is
/// serving. Runs on a blocking thread.
pub fn hand_over(path: &Path, fds: &[RawFd]) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    loop {
        let (mut stream, _) = listener.accept()?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let cmsg = [ControlMessage::ScmRights(fds)];
        let iov = [IoSlice::new(HELLO)];
        if let Err(e) = sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
            tracing::warn!(error = %e, "upgrade: could not send listening sockets");
            continue;
        }
        let mut ack = [0u8; 1];
        match stream.read_exact(&mut ack) {
            // The path now belongs to the successor, which bound it afresh for the next
            // upgrade: leave it alone.
            Ok(()) if ack[0] == TAKEN => return Ok(()),
            // The successor died before serving: keep serving and wait for another.
            _ => tracing::warn!("upgrade: successor did not confirm; still serving"),
        }
    }
}

/// New side: receives the listening sockets from the process waiting at `path`.
pub fn receive(path: &Path, expect: usize) -> std::io::Result<(Vec<OwnedFd>, Successor)> {
    let stream = UnixStream::connect(path)?;
    let mut buf = [0u8; 64];
    let mut cmsg_space = nix::cmsg_space!([RawFd; 4]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::empty(),
        )
        .map_err(std::io::Error::from)?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(std::io::Error::from)? {
            if let ControlMessageOwned::ScmRights(r) = c {
                // SAFETY: the kernel just installed these descriptors in this process for us;
                // nothing else owns them.
                fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        (msg.bytes, fds)
    };
    if &buf[..n] != HELLO || fds.len() != expect {
        return Err(std::io::Error::other(format!(
            "upgrade: unexpected hand-over ({} bytes, {} sockets, wanted {expect})",
            n,
            fds.len()
        )));
    }
    Ok((
        fds,
        Successor {
            stream,
            path: path.to_path_buf(),
        },
    ))
}

/// The new process's side of the hand-over connection.
pub struct Successor {
    stream: UnixStream,
    path: PathBuf,
}

impl Successor {
    /// Tells the old process that this one is serving, so it can drain.
    pub fn confirm(mut self) -> std::io::Result<PathBuf> {
        self.stream.write_all(&[TAKEN])?;
        Ok(self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_socket_crosses_over_and_keeps_its_queue() {
        let dir = std::env::temp_dir().join(format!("saltshaker-upgrade-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("up.sock");
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // A client connects before the hand-over: it waits in the accept queue.
        let mut early = std::net::TcpStream::connect(addr).unwrap();
        let fd = l.as_raw_fd();
        let p2 = path.clone();
        let old = std::thread::spawn(move || hand_over(&p2, &[fd]));
        let mut fds = None;
        for _ in 0..100 {
            if let Ok(x) = receive(&path, 1) {
                fds = Some(x);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (mut fds, succ) = fds.expect("received");
        succ.confirm().unwrap();
        old.join().unwrap().unwrap();
        drop(l);
        let taken = std::net::TcpListener::from(fds.remove(0));
        let (mut conn, _) = taken.accept().unwrap();
        early.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        conn.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
