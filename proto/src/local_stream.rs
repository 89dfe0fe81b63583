//! A connected Unix stream socket that wakes its process only for data, not for room to write.
//!
//! tokio's `UnixStream` registers its socket for both readability and writability, edge
//! triggered. Linux signals a Unix stream socket writable (`unix_write_space`) every time the
//! peer consumes data from it, so with that registration *every message sent wakes the sender
//! once more* when the receiver reads it: a third of a data node's wake-ups under sysbench
//! `oltp_read_write` reported only EPOLLOUT, with nothing to do (TCP does not do this: it
//! signals room only to a writer that found the buffer full). Here the socket is registered for
//! readability alone. Writes go straight to the socket; only a write that finds the buffer full
//! registers a second descriptor of the same socket for writability, waits on it, and drops it
//! with the first write that goes through again.

use std::io::{self, IoSlice, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

pub struct LocalStream {
    /// Registered for readability only.
    socket: AsyncFd<StdUnixStream>,
    /// Another descriptor of the same socket, registered for writability while a write waits
    /// for room.
    room: Option<AsyncFd<StdUnixStream>>,
}

impl LocalStream {
    /// Takes over a connected socket from tokio (deregistering it from tokio's own stream).
    pub fn new(s: tokio::net::UnixStream) -> io::Result<LocalStream> {
        LocalStream::from_std(s.into_std()?)
    }

    /// Registers a connected socket with the current runtime's reactor.
    pub fn from_std(s: StdUnixStream) -> io::Result<LocalStream> {
        s.set_nonblocking(true)?;
        Ok(LocalStream { socket: register(s, Interest::READABLE)?, room: None })
    }

    /// Runs `write` on the socket; on a full buffer, waits for room and tries again.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&StdUnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            match write(self.socket.get_ref()) {
                Ok(n) => {
                    self.room = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let room = match &mut self.room {
                Some(room) => room,
                // Registering checks the current state, so room made since the failed write
                // is not missed.
                None => self.room.insert(register(self.socket.get_ref().try_clone()?, Interest::WRITABLE)?),
            };
            let mut guard = ready!(room.poll_write_ready(cx))?;
            guard.clear_ready();
        }
    }
}

fn register(s: StdUnixStream, interest: Interest) -> io::Result<AsyncFd<StdUnixStream>> {
    // SAFETY: a std `UnixStream` owns its descriptor: it stays open, the same descriptor, until
    // the stream is dropped, which is when the `AsyncFd` holding it is dropped.
    unsafe { AsyncFd::register_with_interest(s, interest) }.map_err(io::Error::from)
}

impl AsyncRead for LocalStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let socket = &self.get_mut().socket;
        loop {
            let mut guard = ready!(socket.poll_read_ready(cx))?;
            let want = buf.remaining();
            // SAFETY: recv only writes into the unfilled part; it de-initialises nothing.
            let into = unsafe { buf.unfilled_mut() };
            match guard.try_io(|s| recv_uninit(s.get_ref(), into)) {
                Ok(Ok(n)) => {
                    // A read that did not fill the buffer drained the socket: wait for the next
                    // edge rather than read again only to hear EAGAIN (half of all reads did).
                    // A wake-up that came in meanwhile is kept: the guard clears only the
                    // readiness it saw.
                    if n > 0 && n < want {
                        guard.clear_ready();
                    }
                    // SAFETY: the kernel wrote the first `n` bytes of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Not readable after all: the readiness was cleared, wait for the next edge.
                Err(_would_block) => continue,
            }
        }
    }
}

/// Reads from `s` straight into the caller's uninitialised buffer. hyper hands over
/// uninitialised memory, which safe code must zero (or fill through a buffer of its own and
/// copy) before reading into it: zeroing cost 6% of a SQL node's instructions under sysbench
/// `oltp_read_write`, the copy through a buffer of our own 1% (the bytes of range reads).
fn recv_uninit(s: &StdUnixStream, into: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `into` is valid for writes of its length, and recv writes at most that many
    // bytes; the descriptor is open while `s` lives.
    let n = unsafe { libc::recv(s.as_raw_fd(), into.as_mut_ptr().cast(), into.len(), 0) };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n => Ok(n as usize),
    }
}

impl AsyncWrite for LocalStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_with(cx, |mut s| s.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_with(cx, |mut s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Bytes go both ways, and a writer that fills the socket's buffer waits for the reader
    /// instead of failing or spinning.
    #[tokio::test]
    async fn carries_bytes_and_waits_for_room() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let (mut a, mut b) = (LocalStream::new(a).expect("a"), LocalStream::new(b).expect("b"));
        a.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        b.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");

        // Far more than a Unix socket buffers: the writer must wait for room several times.
        let big: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let expected = big.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&big).await.expect("write all");
            a.shutdown().await.expect("shutdown");
            a
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.expect("read to end");
        assert!(got == expected, "received {} bytes, not what was sent", got.len());
        let a = writer.await.expect("writer");
        assert!(a.room.is_none(), "the writability registration is dropped once writes go through");
    }
}
