//! Byte streams to clients and nodes: plain TCP or TLS, behind one type.
//!
//! A session and a node connection read on one task and write on another, so a stream is
//! split in two. Plain TCP keeps tokio's lock-free halves (the common case pays one enum
//! match per call); TLS, whose one state machine serves both directions, is split with
//! `tokio::io::split`. `tls` holds the configurations: the client side (certificate
//! reload, optional client CA) and the node side (CA, client certificate, SNI).
//!
//! A leaf: it imports nothing of the crate.

pub mod tls;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// A connected stream, plain or TLS.
pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream>),
}

/// The read half of a `Stream`.
pub enum ReadHalf {
    Tcp(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<Box<TlsStream>>),
}

/// The write half of a `Stream`.
pub enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Box<TlsStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// The socket's file descriptor (CLIENT LIST's `fd`).
    pub fn fd(&self) -> i64 {
        use std::os::fd::AsRawFd;
        self.tcp().as_raw_fd() as i64
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.tcp().set_nodelay(on)
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// Whether the peer has closed an idle connection (or it failed): a look at the
    /// socket that takes nothing from it and does not wait. A connection kept open ahead of
    /// use checks this before it is used.
    pub fn peer_closed(&self) -> bool {
        let mut one = [0u8; 1];
        let mut rb = ReadBuf::new(&mut one);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        matches!(
            self.tcp().poll_peek(&mut cx, &mut rb),
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_))
        )
    }

    /// Writes what the socket takes now, without waiting: over TLS nothing (`WouldBlock`),
    /// as the record layer needs the async path.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Tls(_) => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Tls(s) => {
                let (r, w) = tokio::io::split(s);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

impl ReadHalf {
    /// Reads what the client sent. With nothing left over from the last read, the buffer is
    /// given back first and a new one taken only once data has arrived, so thousands of idle
    /// connections hold no read buffers; a pipelining client keeps its buffer between reads.
    pub async fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if buf.is_empty() {
            if buf.capacity() > 0 {
                *buf = BytesMut::new();
            }
            if let ReadHalf::Tcp(r) = self {
                // The common read of a connection that was idle is one small command (a
                // client sending one at a time): read it on the stack and allocate only its
                // size. A 16 KiB buffer taken and freed per command cost about 3% of the
                // proxy's CPU at pipeline 1 (bench/README.md, "CPU per request"). The chunk
                // lives in one poll only, never in the future while the client is idle.
                // It goes through `poll_read`, which takes a short read as the socket
                // drained: the next wait goes to epoll, where a `try_read` left the
                // readiness set and the next one paid a read that failed with EAGAIN
                // (half a system call per command at pipeline 1).
                return std::future::poll_fn(|cx| {
                    // Uninitialised: zeroing 2 KiB per poll cost about 2% of a
                    // request's instructions at pipeline 1 (callgrind, bench/README.md).
                    let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
                    let mut rb = ReadBuf::uninit(&mut chunk);
                    match Pin::new(&mut *r).poll_read(cx, &mut rb) {
                        Poll::Ready(Ok(())) => {
                            let n = rb.filled().len();
                            if n == rb.capacity() {
                                buf.reserve(16 * 1024);
                            }
                            buf.extend_from_slice(rb.filled());
                            Poll::Ready(Ok(n))
                        }
                        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    }
                })
                .await;
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        // `read_buf` polls `poll_read`, which clears the readiness after a short read too.
        tokio::io::AsyncReadExt::read_buf(self, buf).await
    }

    /// Reads what has already arrived without waiting: `WouldBlock` when nothing has.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ReadHalf::Tcp(r) => r.try_read_buf(buf),
            ReadHalf::Tls(r) => {
                // One poll with a waker that does nothing: TLS may hold decrypted bytes
                // that the socket no longer shows, so ask the TLS layer itself.
                let mut chunk = [0u8; 16 * 1024];
                let mut rb = ReadBuf::new(&mut chunk);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                match Pin::new(r).poll_read(&mut cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        buf.extend_from_slice(rb.filled());
                        Ok(rb.filled().len())
                    }
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }
}

macro_rules! delegate_read {
    ($t:ty, $($v:path),+) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty, $($v:path),+) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }
            fn is_write_vectored(&self) -> bool {
                match self {
                    $($v(s) => s.is_write_vectored(),)+
                }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_flush(cx),)+
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_read!(Stream, Stream::Tcp, Stream::Tls);
delegate_write!(Stream, Stream::Tcp, Stream::Tls);
delegate_read!(ReadHalf, ReadHalf::Tcp, ReadHalf::Tls);
delegate_write!(WriteHalf, WriteHalf::Tcp, WriteHalf::Tls);
